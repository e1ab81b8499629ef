package checkpoint

// DeviceManagerKey is the name of the device manager's checkpoint file, the same
// name the kubelet uses in its device-plugin directory.
const DeviceManagerKey = "kubelet_internal_checkpoint"

// DevicesPerNUMA maps a NUMA node id to the device IDs allocated on that node.
// Key -1 holds devices that reported no topology. One device may be listed
// under several nodes.
type DevicesPerNUMA map[int64][]string

// PodDevicesEntry is one allocation record: the devices of one resource given to
// one container, with the plugin's Allocate response for that container as
// protobuf wire bytes (v1beta1.ContainerAllocateResponse).
//
// The field names, their order and their kinds are part of the checksum and of
// the JSON layout; they must not change.
type PodDevicesEntry struct {
	PodUID        string
	ContainerName string
	ResourceName  string
	DeviceIDs     DevicesPerNUMA
	AllocResp     []byte
}

// checkpointData is the hashed payload. Its type name, like the names of the
// types it holds, is part of the kubelet's checksum.
type checkpointData struct {
	PodDeviceEntries  []PodDevicesEntry
	RegisteredDevices map[string][]string
}

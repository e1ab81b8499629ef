// Package checkpoint (in directory legacyspew) holds the checkpoint layout that
// kubelets before 1.20 wrote, for tests only: it lets go-spew print that layout
// with the type names those kubelets hashed. The package name must be
// "checkpoint", because go-spew prints it as part of every type name.
package checkpoint

import "github.com/davecgh/go-spew/spew"

// PodDevicesEntry is an allocation record of the pre-1.20 layout.
type PodDevicesEntry struct {
	PodUID        string
	ContainerName string
	ResourceName  string
	DeviceIDs     []string
	AllocResp     []byte
}

type checkpointData struct {
	PodDeviceEntries  []PodDevicesEntry
	RegisteredDevices map[string][]string
}

// ForHash is the go-spew configuration of k8s.io/utils/dump.ForHash, with
// which the kubelet prints the text it hashes.
var ForHash = spew.ConfigState{
	Indent:                  " ",
	SortKeys:                true,
	DisableMethods:          true,
	SpewKeys:                true,
	DisablePointerAddresses: true,
	DisableCapacities:       true,
}

// Text returns the text a pre-1.20 kubelet hashed for this content.
func Text(entries []PodDevicesEntry, registered map[string][]string) string {
	return ForHash.Sprintf("%#v", checkpointData{PodDeviceEntries: entries, RegisteredDevices: registered})
}

// Package blackbox is devmgr's black-box test suite. Its tests (package
// blackbox_test) use only the stable public surface, the names that an
// alternative kubelet or a node agent compiles against and that change only
// by adding:
//
//   - devicemanager: Options, NewManagerImpl, the ManagerImpl methods that
//     follow the kubelet's device manager (Start, Stop, Allocate,
//     GetDeviceRunContainerOptions, GetCapacity, GetDevices,
//     GetAllocatableDevices, the topology hints, UpdateAllocatedDevices,
//     UpdatePluginResources, UpdateAllocatedResourcesStatus, Updates,
//     GetWatcherHandler, HealthCheck ...) and the sentinel errors;
//   - topology: BitMask, Hint, Discover;
//   - podstate: ContainerRef, ContainerMap;
//   - checkpoint: the file format (New, Data, PodDevicesEntry,
//     DevicesPerNUMA), the store (NewManager), its errors and
//     DeviceManagerKey.
//
// The tests check that devmgr behaves as the kubelet's device manager does,
// except where it deliberately differs; there the test's comment says what
// the kubelet does instead. They drive the manager through kubelet.sock and
// a small fake device plugin of their own, as an external consumer would,
// and never use plugintest or unexported names.
package blackbox

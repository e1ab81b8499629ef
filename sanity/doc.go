// Package sanity checks a device plugin the way the kubelet will use it: a
// conformance suite that a plugin's author runs from go test or in CI, in the
// manner of csi-sanity for CSI drivers.
//
// The suite serves kubelet.sock in a socket directory, waits for the plugin
// to register, and runs named checks against it, each a subtest under Test
// and a Result under Run:
//
//	registration/version             RegisterRequest.Version is one the kubelet speaks
//	registration/resource-name       an extended resource name (domain/name, outside kubernetes.io)
//	registration/endpoint            a file name in the socket directory, where the plugin serves
//	registration/options             GetDevicePluginOptions answers, and agrees with RegisterRequest.Options when sent
//	list-and-watch/first-list        a first list within ListTimeout, with a healthy device
//	list-and-watch/update            a new list after Config.TriggerUpdate (skipped without it)
//	list-and-watch/device-ids        unique, non-empty IDs in every list
//	list-and-watch/health            Healthy or Unhealthy
//	list-and-watch/topology          NUMA node ids that exist on the machine
//	preferred-allocation/subset      the answer is drawn from the available devices, without repeats
//	preferred-allocation/must-include  it includes every must-include device
//	preferred-allocation/size        it has the requested size (all three skipped when not advertised)
//	allocate/responses               one container response per container request
//	allocate/device-specs            absolute paths, permissions made of r, w and m
//	allocate/envs                    valid environment variable names
//	allocate/cdi                     CDI device names that parse (vendor/class=name)
//	allocate/mounts                  absolute paths
//	allocate/unknown-device          a device the plugin never listed is refused
//	pre-start/answered               PreStartContainer answers (skipped when not advertised)
//	concurrency/allocate             Config.Parallel concurrent Allocate calls all answered, correctly
//	restart/re-register              after the kubelet restarts (its streams and connections end,
//	                                 kubelet.sock and every socket in the directory are removed,
//	                                 kubelet.sock is served again) the plugin registers again
//	                                 within ReregisterTimeout, with the same devices
//
// A failure names the rule and what the plugin sent, for example
//
//	allocate/mounts: mounts with absolute paths: Mount{ContainerPath: "run/gpu", HostPath: "/run/gpu"}
//
// Allocate checks ask for one device per container, preferred allocations
// for two (Config.MaxDevicesPerContainer lowers that for plugins of shared
// devices). When the plugin registers again during the run, as a new
// process on a new socket, the checks follow its newest registration, as the
// kubelet does.
//
// The suite's kubelet checks a registration as the kubelet does, with the
// kubelet's messages, and answers with the same errors; unlike the kubelet,
// it still dials back a plugin whose request it refused, so that the other
// checks can run. It refuses a directory whose kubelet.sock accepts
// connections, so it never takes over a running kubelet's.
//
// From a Go test, with a plugin the test starts:
//
//	func TestSanity(t *testing.T) {
//		sanity.Test(t, sanity.Config{
//			StartPlugin: func(socketDir string) error {
//				return startMyPlugin(t, socketDir) // serves, then registers on socketDir/kubelet.sock
//			},
//		})
//	}
//
// go test -run 'TestSanity/allocate' selects checks. For a plugin binary
// started separately, devmgr sanity --socket-dir DIR runs the same checks and
// writes a summary and JUnit XML.
package sanity

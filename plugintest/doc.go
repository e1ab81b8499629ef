// Package plugintest provides a real device plugin for tests: a gRPC server
// of the kubelet device-plugin API (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1)
// on a unix socket, configured by Options, with hooks that replace its
// behaviour, recorded calls and failure injection. Use it to test devmgr, a
// kubelet, or anything else that talks to device plugins, without writing a
// plugin.
//
// # Lifecycle
//
//	p, err := plugintest.New(plugintest.Options{
//		ResourceName: "example.com/gpu",
//		SocketDir:    dir, // the directory of kubelet.sock
//		Devices:      devices,
//	})
//	t.Cleanup(p.Stop)
//	err = p.Start()                                       // serve the DevicePlugin service
//	err = p.Register(filepath.Join(dir, "kubelet.sock"))  // register with the kubelet
//
// Start listens on SocketDir/Endpoint (removing a stale socket first) and
// serves. Register dials the kubelet's socket and sends a RegisterRequest;
// the kubelet dials back during that call, so Start comes first. Calling
// Register again re-registers; RegisterWith sends any request, malformed
// ones included. After a successful Register the Plugin follows the kubelet
// as real plugins do (unless Options.NoReregister): each time kubelet.sock is
// created anew (the kubelet restarted, removing the sockets in its
// directory), it serves its socket again and registers again, until Stop.
//
// ServeRegistry serves the pluginregistration Registration service for the
// kubelet's plugin-watcher path instead (GetInfo, NotifyRegistrationStatus).
// Stop ends every stream and call, stops both servers, removes the sockets
// and returns when every goroutine the Plugin started has ended (the file
// watcher the Plugins of a process share ends with the last of them); it is
// idempotent and safe before Start. A stopped Plugin cannot be started
// again: a new Plugin with the same Options simulates a plugin restart, and
// may start before the old one stops (each removes only the socket file it
// created; the newer one alone registers again after a kubelet restart).
//
// # Default behaviour
//
// GetDevicePluginOptions returns PreStartRequired and
// GetPreferredAllocationAvailable from Options. ListAndWatch sends the
// current device list when the stream opens (after an empty message with
// Options.EmptyFirstMessage), then every Update, in order; CloseStreams ends
// the open streams. Allocate refuses, with InvalidArgument, a device the
// Plugin never listed (CheckListed), as a real plugin does, and otherwise
// answers DefaultAllocate, a deterministic function of the requested device
// IDs; GetPreferredAllocation answers
// DefaultPreferredAllocation; PreStartContainer answers an empty response.
// SetAllocateFunc, SetPreferredAllocationFunc, SetPreStartFunc and
// SetOptionsFunc replace these at any time. With these defaults a Plugin
// passes every check of package sanity that its Options let run.
//
// # Recorded calls and failure injection
//
// Every RPC is recorded when it arrives, with a copy of its request, its time
// and its deadline: Calls, CallsOf, and WaitForCalls, which waits for a
// number of calls without sleeping. Then, in this order, a call waits for
// the Blocks in place when it arrived, waits for the delay set by SetDelay,
// and fails with the error set by SetError. Block is the tool for
// deterministic tests of deadlines and in-flight calls:
//
//	release := p.Block(plugintest.MethodAllocate)
//	go admit()                                          // calls Allocate
//	p.WaitForCalls(ctx, plugintest.MethodAllocate, 1)   // the call is in flight
//	...                                                 // observe the caller meanwhile
//	release()
//
// A blocked or delayed call ends early, with the status of its context, when
// the caller's deadline passes or it cancels, and with codes.Unavailable when
// the Plugin stops.
//
// # Concurrency
//
// Every method of Plugin is safe for concurrent use, from tests and from
// hooks. Hooks are called with no lock held and must return when their
// context ends, or Stop waits for them. Messages returned by the Plugin
// (Devices, Calls, PluginInfo, RegisterRequest) are copies the caller owns;
// messages given to it (Options.Devices, Update, SetPluginInfo) are copied.
package plugintest

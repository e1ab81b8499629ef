package main

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// subject is one device manager under test, driven through the calls both
// implementations share. Neither implementation's internals are reached: a
// workload sees what an embedding kubelet sees.
type subject interface {
	// Start constructs the manager and starts it (the constructor is part of
	// what W4 times). pods gives the active pods.
	Start(pods func() []*v1.Pod) error
	Stop()
	Allocate(ctx context.Context, pod *v1.Pod, container *v1.Container) error
	// Capacity returns the capacity and allocatable of res, and whether res
	// is listed at all.
	Capacity(res string) (capacity, allocatable int64, listed bool)
	// Devices returns the device IDs the container holds of res.
	Devices(podUID, container, res string) []string
	// Hints returns how many topology hints the container gets for res, -1
	// for nil (no preference).
	Hints(pod *v1.Pod, container *v1.Container, res string) int
	// SocketDir holds kubelet.sock, the plugins' sockets and the checkpoint.
	SocketDir() string
	// DrainUpdates consumes the manager's Updates channel, as a kubelet does,
	// until the process ends.
	DrainUpdates()
	// Receive hands one ListAndWatch message for res to the manager's
	// PluginListAndWatchReceiver, the method the kubelet's plugin client
	// calls for each message (both modules export it). Both implementations
	// apply the list and write the checkpoint before it returns.
	Receive(res string, devs []*pluginapi.Device)
}

const checkpointName = "kubelet_internal_checkpoint"

func kubeletSocket(s subject) string  { return filepath.Join(s.SocketDir(), "kubelet.sock") }
func checkpointPath(s subject) string { return filepath.Join(s.SocketDir(), checkpointName) }

func newSubject(impl, dir string, log logr.Logger) (subject, error) {
	switch impl {
	case "devmgr":
		return newDevmgrSubject(dir, log)
	case "kubelet":
		return newKubeletSubject(dir, log)
	}
	return nil, fmt.Errorf("unknown implementation %q (want devmgr or kubelet)", impl)
}

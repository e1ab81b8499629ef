package main

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/topology"
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
		return &devmgrSubject{dir: dir, log: log}, nil
	case "kubelet":
		return newKubeletSubject(dir, log)
	}
	return nil, fmt.Errorf("unknown implementation %q (want devmgr or kubelet)", impl)
}

// devmgrSubject drives devmgr's ManagerImpl.
type devmgrSubject struct {
	dir string
	log logr.Logger
	m   *devicemanager.ManagerImpl
}

// noAffinity is a topology manager with the "none" policy: no container has
// a NUMA affinity. The kubelet side gets the same (kubeletNoAffinity).
type noAffinity struct{}

func (noAffinity) GetAffinity(string, string) topology.Hint { return topology.Hint{} }

func (s *devmgrSubject) Start(pods func() []*v1.Pod) error {
	m, err := devicemanager.NewManagerImpl(devicemanager.Options{
		SocketDir:     s.dir,
		NUMANodes:     numaNodes,
		AffinityStore: noAffinity{},
		Logger:        s.log,
	})
	if err != nil {
		return err
	}
	s.m = m
	return m.Start(devicemanager.ActivePodsFunc(pods), nil, nil, nil)
}

func (s *devmgrSubject) Stop() {
	if s.m != nil {
		_ = s.m.Stop()
	}
}

func (s *devmgrSubject) Allocate(ctx context.Context, pod *v1.Pod, c *v1.Container) error {
	return s.m.Allocate(ctx, pod, c)
}

func (s *devmgrSubject) Capacity(res string) (int64, int64, bool) {
	c, a, _ := s.m.GetCapacity()
	q, ok := c[v1.ResourceName(res)]
	aq := a[v1.ResourceName(res)]
	return q.Value(), aq.Value(), ok
}

func (s *devmgrSubject) Devices(podUID, container, res string) []string {
	var ids []string
	for id := range s.m.GetDevices(podUID, container)[res] {
		ids = append(ids, id)
	}
	return ids
}

func (s *devmgrSubject) Hints(pod *v1.Pod, c *v1.Container, res string) int {
	h := s.m.GetTopologyHints(pod, c)[res]
	if h == nil {
		return -1
	}
	return len(h)
}

func (s *devmgrSubject) SocketDir() string { return s.dir }

func (s *devmgrSubject) Receive(res string, devs []*pluginapi.Device) {
	s.m.PluginListAndWatchReceiver(s.log, res, &pluginapi.ListAndWatchResponse{Devices: devs})
}

func (s *devmgrSubject) DrainUpdates() {
	ch := s.m.Updates()
	go func() {
		for range ch { //nolint:revive // discard until Stop closes the channel
		}
	}()
}

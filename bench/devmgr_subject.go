//go:build !kubeletonly

package main

import (
	"context"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/topology"
)

// devmgrLinked: this build runs devmgr.
const devmgrLinked = true

func newDevmgrSubject(dir string, log logr.Logger) (subject, error) {
	return &devmgrSubject{dir: dir, log: log}, nil
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

//go:build !devmgronly

package main

import (
	"context"
	"fmt"
	"path/filepath"
	"syscall"

	"github.com/go-logr/logr"
	cadvisorapi "github.com/google/cadvisor/lib/model"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	kubeletdm "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
)

// kubeletLinked: this build runs the kubelet's device manager.
const kubeletLinked = true

// kubeletSubject drives the kubelet's own device manager, v1.37.2. Its
// constructor hard-codes /var/lib/kubelet/device-plugins, so it only runs in
// a private mount namespace where that path is a bind mount of the run's
// directory (see nsScript); newKubeletSubject checks that it is.
type kubeletSubject struct {
	log klog.Logger
	m   *kubeletdm.ManagerImpl
}

func newKubeletSubject(dir string, log logr.Logger) (subject, error) {
	var want, got syscall.Stat_t
	if err := syscall.Stat(dir, &want); err != nil {
		return nil, err
	}
	if err := syscall.Stat(pluginapi.DevicePluginPath, &got); err != nil {
		return nil, fmt.Errorf("kubelet side: %w (run it through `bench compare`, which mounts it)", err)
	}
	if want.Dev != got.Dev || want.Ino != got.Ino {
		return nil, fmt.Errorf("kubelet side: %s is not a bind mount of %s; refusing to touch it",
			pluginapi.DevicePluginPath, dir)
	}
	return &kubeletSubject{log: log}, nil
}

// kubeletNoAffinity is the topology manager store with the "none" policy.
type kubeletNoAffinity struct{}

func (kubeletNoAffinity) GetAffinity(klog.Logger, string, string) topologymanager.TopologyHint {
	return topologymanager.TopologyHint{}
}
func (kubeletNoAffinity) GetPolicy() topologymanager.Policy { return topologymanager.NewNonePolicy() }
func (kubeletNoAffinity) Name() string                      { return "bench" }

// sourcesReady says every pod source has been seen, as devmgr's nil does.
type sourcesReady struct{}

func (sourcesReady) AddSource(string) {}
func (sourcesReady) AllReady() bool   { return true }

func (s *kubeletSubject) Start(pods func() []*v1.Pod) error {
	nodes := make([]cadvisorapi.Node, len(numaNodes))
	for i, id := range numaNodes {
		nodes[i] = cadvisorapi.Node{Id: id}
	}
	m, err := kubeletdm.NewManagerImpl(s.log, nodes, kubeletNoAffinity{})
	if err != nil {
		return err
	}
	s.m = m
	return m.Start(s.log, kubeletdm.ActivePodsFunc(pods), sourcesReady{},
		containermap.NewContainerMap(), sets.New[string]())
}

func (s *kubeletSubject) Stop() {
	if s.m != nil {
		_ = s.m.Stop(s.log)
	}
}

func (s *kubeletSubject) Allocate(ctx context.Context, pod *v1.Pod, c *v1.Container) error {
	return s.m.Allocate(ctx, pod, c, lifecycle.AddOperation)
}

func (s *kubeletSubject) Capacity(res string) (int64, int64, bool) {
	c, a, _ := s.m.GetCapacity(s.log)
	q, ok := c[v1.ResourceName(res)]
	aq := a[v1.ResourceName(res)]
	return q.Value(), aq.Value(), ok
}

func (s *kubeletSubject) Devices(podUID, container, res string) []string {
	var ids []string
	for id := range s.m.GetDevices(podUID, container)[res] {
		ids = append(ids, id)
	}
	return ids
}

func (s *kubeletSubject) Hints(pod *v1.Pod, c *v1.Container, res string) int {
	h := s.m.GetTopologyHints(s.log, pod, c, lifecycle.AddOperation)[res]
	if h == nil {
		return -1
	}
	return len(h)
}

func (s *kubeletSubject) Receive(res string, devs []*pluginapi.Device) {
	s.m.PluginListAndWatchReceiver(s.log, res, &pluginapi.ListAndWatchResponse{Devices: devs})
}

func (s *kubeletSubject) SocketDir() string { return filepath.Clean(pluginapi.DevicePluginPath) }

func (s *kubeletSubject) DrainUpdates() {
	ch := s.m.Updates()
	go func() {
		for range ch { //nolint:revive // the kubelet never closes it; the process ends
		}
	}()
}

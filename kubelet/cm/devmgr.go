// Package cm holds the one file that make kubelet adds to the kubelet's
// container manager (k8s.io/kubernetes/pkg/kubelet/cm) through a build
// overlay. It compiles here on its own, as a package of the same name, so
// that vet and lint see it; the overlay puts it beside the kubelet's files.
package cm

import (
	"path/filepath"

	cadvisorapi "github.com/google/cadvisor/lib/model"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	kubeletdm "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"

	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/kubeletcompat"
)

// newDevmgrDeviceManager takes the place of the kubelet's
// devicemanager.NewManagerImpl, with the same arguments: the machine's NUMA
// nodes and the topology manager's store. devmgr serves kubelet.sock and
// keeps its checkpoint where the kubelet's manager does; every option the
// kubelet has no flag for keeps devmgr's default.
//
//nolint:unused // called by the kubelet's container_manager_linux.go, through the overlay
func newDevmgrDeviceManager(logger klog.Logger, topology []cadvisorapi.Node, store topologymanager.Store) (kubeletdm.Manager, error) {
	numa := make([]int, 0, len(topology))
	for _, n := range topology {
		numa = append(numa, n.Id)
	}
	logger.Info("Using devmgr as the device manager")
	m, err := kubeletcompat.New(devicemanager.Options{
		SocketDir: filepath.Dir(pluginapi.KubeletSocket),
		NUMANodes: numa,
		Logger:    logger,
	}, store)
	if err != nil {
		return nil, err
	}
	return m, nil
}

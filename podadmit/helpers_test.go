package podadmit_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/plugintest"
	"github.com/openkubelet/devmgr/podadmit"
)

const gpu = "example.com/gpu"

// agent is a node agent's device side: a manager whose active pods are its
// admitter's, and one plugin serving gpus devices gpu-0, gpu-1, ...
type agent struct {
	dir    string
	mgr    *devicemanager.ManagerImpl
	adm    *podadmit.Admitter
	plugin *plugintest.Plugin
}

// startAgent starts an agent in a new short temporary directory and waits
// until the plugin's devices are allocatable. stop undoes what it started,
// also when it fails.
func startAgent(gpus int) (_ *agent, err error) {
	dir, err := os.MkdirTemp("", "pa")
	if err != nil {
		return nil, err
	}
	a := &agent{dir: dir}
	defer func() {
		if err != nil {
			a.stop()
		}
	}()
	a.mgr, err = devicemanager.NewManagerImpl(devicemanager.Options{SocketDir: dir})
	if err != nil {
		return nil, err
	}
	a.adm = podadmit.New(a.mgr)
	if err := a.mgr.Start(a.adm.ActivePods, nil, nil, nil); err != nil {
		return nil, err
	}
	a.plugin, err = startGPUPlugin(a.mgr, dir, gpus)
	if err != nil {
		return nil, err
	}
	return a, nil
}

// startGPUPlugin starts a plugintest plugin serving n healthy devices gpu-0,
// gpu-1, ... in dir, registers it with mgr and waits until mgr counts the
// devices as free.
func startGPUPlugin(mgr *devicemanager.ManagerImpl, dir string, n int) (_ *plugintest.Plugin, err error) {
	devices := make([]*pluginapi.Device, n)
	for i := range devices {
		devices[i] = &pluginapi.Device{ID: fmt.Sprintf("gpu-%d", i), Health: pluginapi.Healthy}
	}
	p, err := plugintest.New(plugintest.Options{ResourceName: gpu, SocketDir: dir, Devices: devices})
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			p.Stop()
		}
	}()
	if err := p.Start(); err != nil {
		return nil, err
	}
	if err := p.Register(filepath.Join(dir, devicemanager.KubeletSocketName)); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for gpuStatus(mgr).Free < n {
		if time.Now().After(deadline) {
			return nil, errors.New("the plugin's devices did not reach the manager")
		}
		<-tick.C
	}
	return p, nil
}

func (a *agent) stop() {
	if a.mgr != nil {
		_ = a.mgr.Stop()
	}
	if a.plugin != nil {
		a.plugin.Stop()
	}
	_ = os.RemoveAll(a.dir)
}

// gpuStatus returns what mgr reports of the gpus.
func gpuStatus(mgr *devicemanager.ManagerImpl) devicemanager.ResourceStatus {
	for _, rs := range mgr.Status() {
		if rs.Name == gpu {
			return rs
		}
	}
	return devicemanager.ResourceStatus{}
}

// gpus returns a container asking for n gpus.
func gpus(name string, n int64) v1.Container {
	return v1.Container{Name: name, Resources: v1.ResourceRequirements{Limits: v1.ResourceList{
		gpu: *resource.NewQuantity(n, resource.DecimalSI)}}}
}

// sidecar returns a restartable init container asking for n gpus.
func sidecar(name string, n int64) v1.Container {
	c := gpus(name, n)
	always := v1.ContainerRestartPolicyAlways
	c.RestartPolicy = &always
	return c
}

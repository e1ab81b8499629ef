package devicemanager_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/plugintest"
)

// After a restart the manager knows a resource from its checkpoint before
// the resource's plugin has registered again. Allocate refuses such a
// resource with ErrPluginNotReady, which says "retry", where a plugin
// without healthy devices gives ErrNoHealthyDevices; with
// Options.PluginWaitTimeout it waits for the plugin itself.
func ExampleManagerImpl_Allocate_retry() {
	dir, _ := os.MkdirTemp("", "dm")
	defer os.RemoveAll(dir)
	gpuPod := func(uid string) *v1.Pod {
		return &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: uid, Namespace: "default", UID: types.UID("uid-" + uid)},
			Spec: v1.PodSpec{Containers: []v1.Container{{
				Name:      "app",
				Resources: v1.ResourceRequirements{Limits: v1.ResourceList{"example.com/gpu": resource.MustParse("1")}},
			}}},
		}
	}
	first, second := gpuPod("first"), gpuPod("second")
	activePods := func() []*v1.Pod { return []*v1.Pod{first, second} }
	startPlugin := func() *plugintest.Plugin {
		p, _ := plugintest.New(plugintest.Options{
			ResourceName: "example.com/gpu",
			SocketDir:    dir,
			Devices: []*pluginapi.Device{
				{ID: "gpu-0", Health: pluginapi.Healthy}, {ID: "gpu-1", Health: pluginapi.Healthy},
			},
			NoReregister: true, // this example says when the plugin is back
		})
		_ = p.Start()
		return p
	}
	opts := devicemanager.Options{SocketDir: dir, PluginWaitTimeout: time.Minute}
	ctx := context.Background()

	// Before the restart: the plugin registers, and the first pod waits
	// for its device list and gets a GPU. The checkpoint keeps both.
	before, _ := devicemanager.NewManagerImpl(opts)
	_ = before.Start(activePods, nil, nil, nil)
	plugin := startPlugin()
	_ = plugin.Register(dir + "/kubelet.sock")
	if err := before.Allocate(ctx, first, &first.Spec.Containers[0]); err != nil {
		panic(err)
	}
	_ = before.Stop()
	plugin.Stop()

	// After the restart, no plugin yet. A caller that gives up early gets
	// ErrPluginNotReady with its context's error.
	mgr, _ := devicemanager.NewManagerImpl(opts)
	_ = mgr.Start(activePods, nil, nil, nil)
	defer mgr.Stop()
	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	err := mgr.Allocate(short, second, &second.Spec.Containers[0])
	cancel()
	fmt.Println(err)
	fmt.Println("retry:", errors.Is(err, devicemanager.ErrPluginNotReady),
		"unhealthy:", errors.Is(err, devicemanager.ErrNoHealthyDevices),
		"deadline:", errors.Is(err, context.DeadlineExceeded))

	// The plugin comes back while Allocate waits for it.
	plugin = startPlugin()
	defer plugin.Stop()
	registered := make(chan error, 1)
	go func() { registered <- plugin.Register(dir + "/kubelet.sock") }()
	err = mgr.Allocate(ctx, second, &second.Spec.Containers[0])
	if err := errors.Join(err, <-registered); err != nil {
		panic(err)
	}
	for id := range mgr.GetDevices("uid-second", "app")["example.com/gpu"] {
		fmt.Println("admitted with", id)
	}
	// Output:
	// no healthy devices present; cannot allocate unhealthy devices example.com/gpu: device plugin not ready (no plugin instance is connected): context deadline exceeded
	// retry: true unhealthy: false deadline: true
	// admitted with gpu-1
}

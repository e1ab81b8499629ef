package devicemanager_test

import (
	"context"
	"fmt"
	"os"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/plugintest"
)

// Embedding the manager: start it, let a plugin register, admit a pod and
// get what its container runtime needs. docs/EMBEDDING.md shows the same calls.
func Example() {
	dir, _ := os.MkdirTemp("", "dm")
	defer os.RemoveAll(dir)

	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "cuda", Namespace: "default", UID: "uid-1"},
		Spec: v1.PodSpec{Containers: []v1.Container{{
			Name: "app",
			Resources: v1.ResourceRequirements{Limits: v1.ResourceList{
				"example.com/gpu": resource.MustParse("1"),
			}},
		}}},
	}
	activePods := func() []*v1.Pod { return []*v1.Pod{pod} }

	// --- the embedding ---
	mgr, err := devicemanager.NewManagerImpl(devicemanager.Options{
		SocketDir: dir, // kubelet.sock is served here; /var/lib/kubelet/device-plugins by default
	})
	if err != nil {
		panic(err)
	}
	if err := mgr.Start(activePods, nil, nil, nil); err != nil {
		panic(err)
	}
	defer mgr.Stop()

	// A device plugin registers (here the fake one from plugintest).
	plugin, _ := plugintest.New(plugintest.Options{
		ResourceName: "example.com/gpu",
		SocketDir:    dir,
		Devices:      []*pluginapi.Device{{ID: "gpu-0", Health: pluginapi.Healthy}},
	})
	defer plugin.Stop()
	_ = plugin.Start()
	_ = plugin.Register(dir + "/kubelet.sock")
	// Its devices count once its first ListAndWatch message is in.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for _, allocatable, _ := mgr.GetCapacity(); allocatable.Name("example.com/gpu", resource.DecimalSI).IsZero(); _, allocatable, _ = mgr.GetCapacity() {
		<-tick.C
	}

	// Admission: give the container its devices, then what the runtime needs.
	ctx := context.Background()
	if err := mgr.Allocate(ctx, pod, &pod.Spec.Containers[0]); err != nil {
		panic(err) // wraps devicemanager.ErrInsufficientDevices and friends
	}
	opts, err := mgr.GetDeviceRunContainerOptions(ctx, pod, &pod.Spec.Containers[0])
	if err != nil {
		panic(err)
	}
	// --- end of the embedding ---

	for res, devs := range mgr.GetDevices("uid-1", "app") {
		for id := range devs {
			fmt.Println(res, id)
		}
	}
	for _, env := range opts.Envs {
		fmt.Printf("%s=%s\n", env.Name, env.Value)
	}
	// Output:
	// example.com/gpu gpu-0
	// PLUGINTEST_EXAMPLE_COM_GPU=gpu-0
}

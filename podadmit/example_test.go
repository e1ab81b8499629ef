package podadmit_test

import (
	"context"
	"fmt"
	"os"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/podadmit"
)

// A node agent admits a pod with a regular init container, a sidecar and an
// app container, against a plugin serving three GPUs, then releases it. The
// sidecar takes one of the init container's GPUs and keeps it; the app
// container gets the other two.
func Example() {
	dir, _ := os.MkdirTemp("", "pa")
	defer os.RemoveAll(dir)

	mgr, err := devicemanager.NewManagerImpl(devicemanager.Options{SocketDir: dir})
	if err != nil {
		panic(err)
	}
	adm := podadmit.New(mgr)
	// The manager's active pods are the admitter's: admitted or being admitted.
	if err := mgr.Start(adm.ActivePods, nil, nil, nil); err != nil {
		panic(err)
	}
	defer mgr.Stop()
	plugin, err := startGPUPlugin(mgr, dir, 3) // plugintest, serving gpu-0, gpu-1, gpu-2
	if err != nil {
		panic(err)
	}
	defer plugin.Stop()

	always := v1.ContainerRestartPolicyAlways
	metrics := gpus("metrics", 1)
	metrics.RestartPolicy = &always // a sidecar
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "training", Namespace: "default", UID: "uid-1"},
		Spec: v1.PodSpec{
			InitContainers: []v1.Container{gpus("fetch-weights", 3), metrics},
			Containers:     []v1.Container{gpus("train", 2)},
		},
	}
	a, err := adm.Admit(context.Background(), pod)
	if err != nil {
		panic(err) // an *podadmit.AdmitError names the container; the pod holds nothing
	}
	for _, c := range a.Containers {
		fmt.Println(c.Name, c.Devices["example.com/gpu"], c.RunOptions.Envs)
	}
	fmt.Println("allocated:", gpuStatus(mgr).Allocated)

	fmt.Println("released:", adm.Release(a.UID))
	fmt.Println("allocated:", gpuStatus(mgr).Allocated)
	// Output:
	// fetch-weights [gpu-0 gpu-1 gpu-2] [{PLUGINTEST_EXAMPLE_COM_GPU gpu-0,gpu-1,gpu-2}]
	// metrics [gpu-0] [{PLUGINTEST_EXAMPLE_COM_GPU gpu-0}]
	// train [gpu-1 gpu-2] [{PLUGINTEST_EXAMPLE_COM_GPU gpu-1,gpu-2}]
	// allocated: 3
	// released: true
	// allocated: 0
}

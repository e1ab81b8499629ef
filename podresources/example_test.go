package podresources_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/plugintest"
	"github.com/openkubelet/devmgr/podresources"
)

// Serving the podresources API from a device manager, and reading it the
// way monitoring agents do.
func Example() {
	dir, _ := os.MkdirTemp("", "pr")
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

	mgr, _ := devicemanager.NewManagerImpl(devicemanager.Options{SocketDir: dir, NUMANodes: []int{0, 1}})
	_ = mgr.Start(activePods, nil, nil, nil)
	defer mgr.Stop()

	plugin, _ := plugintest.New(plugintest.Options{
		ResourceName: "example.com/gpu",
		SocketDir:    dir,
		Devices: []*pluginapi.Device{
			{ID: "gpu-0", Health: pluginapi.Healthy, Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: 1}}}},
			{ID: "gpu-1", Health: pluginapi.Unhealthy},
		},
	})
	defer plugin.Stop()
	_ = plugin.Start()
	_ = plugin.Register(filepath.Join(dir, devicemanager.KubeletSocketName))
	waitForDevices(mgr, "example.com/gpu")
	_ = mgr.Allocate(context.Background(), pod, &pod.Spec.Containers[0])

	// --- the podresources server ---
	srv, err := podresources.NewServer(mgr, podresources.PodsFunc(activePods), podresources.Options{})
	if err != nil {
		panic(err)
	}
	socket := filepath.Join(dir, "pod-resources", podresources.SocketName)
	if err := srv.Start(socket); err != nil {
		panic(err)
	}
	defer func() { _ = srv.Stop() }()

	// --- a client ---
	conn, _ := grpc.NewClient("unix://"+socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
	defer conn.Close()
	client := podresourcesv1.NewPodResourcesListerClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	list, _ := client.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	for _, p := range list.GetPodResources() {
		for _, c := range p.GetContainers() {
			for _, d := range c.GetDevices() {
				fmt.Printf("%s/%s %s: %s %v on NUMA %v\n", p.GetNamespace(), p.GetName(), c.GetName(),
					d.GetResourceName(), d.GetDeviceIds(), d.GetTopology().GetNodes()[0].GetID())
			}
		}
	}
	alloc, _ := client.GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{})
	fmt.Println("allocatable:", len(alloc.GetDevices()), "device (the unhealthy one is left out)")
	_, err = client.Get(ctx, &podresourcesv1.GetPodResourcesRequest{PodNamespace: "default", PodName: "gone"})
	fmt.Println(err)
	// Output:
	// default/cuda app: example.com/gpu [gpu-0] on NUMA 1
	// allocatable: 1 device (the unhealthy one is left out)
	// rpc error: code = NotFound desc = pod gone in namespace default not found
}

// waitForDevices waits, for up to ten seconds, until the manager has the
// device list of res.
func waitForDevices(mgr *devicemanager.ManagerImpl, res string) {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Second)
	for {
		if _, ok := mgr.GetAllocatableDevices()[res]; ok {
			return
		}
		select {
		case <-tick.C:
		case <-deadline:
			return
		}
	}
}

package plugintest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/plugintest"
	"github.com/openkubelet/devmgr/podinfo"
)

// A plugin author's test, run against devmgr instead of a kubelet: how does
// admission behave when the plugin's Allocate fails, and what does the
// plugin receive once it recovers? In a real test the plugin would be the
// author's own; here plugintest plays it.
func Example_withDevmgr() {
	dir, _ := os.MkdirTemp("", "pt")
	defer os.RemoveAll(dir)

	mgr, _ := devicemanager.NewManagerImpl(devicemanager.Options{SocketDir: dir})
	_ = mgr.Start(nil, nil, nil, nil)
	defer mgr.Stop()

	p, _ := plugintest.New(plugintest.Options{
		ResourceName: "example.com/fpga",
		SocketDir:    dir,
		Devices:      []*pluginapi.Device{{ID: "fpga-0", Health: pluginapi.Healthy}},
	})
	defer p.Stop()
	_ = p.Start()
	_ = p.Register(filepath.Join(dir, devicemanager.KubeletSocketName))
	waitAllocatable(mgr, "example.com/fpga")

	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "job", Namespace: "default", UID: "uid-7"},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "main", Resources: v1.ResourceRequirements{
			Limits: v1.ResourceList{"example.com/fpga": resource.MustParse("1")},
		}}}},
	}
	ctx := context.Background()

	p.SetError(plugintest.MethodAllocate, status.Error(codes.Unavailable, "bitstream not loaded"))
	err := mgr.Allocate(ctx, pod, &pod.Spec.Containers[0])
	fmt.Println("plugin failing:", errors.Is(err, devicemanager.ErrPluginCall), status.Code(err))

	p.SetError(plugintest.MethodAllocate, nil)
	err = mgr.Allocate(ctx, pod, &pod.Spec.Containers[0])
	fmt.Println("plugin recovered:", err)
	for _, call := range p.CallsOf(plugintest.MethodAllocate) {
		req := call.Request.(*pluginapi.AllocateRequest)
		fmt.Println("Allocate asked for", req.ContainerRequests[0].DevicesIds, "with a deadline:", !call.Deadline.IsZero())
	}
	// Output:
	// plugin failing: true Unavailable
	// plugin recovered: <nil>
	// Allocate asked for [fpga-0] with a deadline: true
	// Allocate asked for [fpga-0] with a deadline: true
}

// waitAllocatable waits until the manager counts a healthy device of res.
func waitAllocatable(mgr *devicemanager.ManagerImpl, res v1.ResourceName) {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, allocatable, _ := mgr.GetCapacity(); !allocatable.Name(res, resource.DecimalSI).IsZero() {
			return
		}
		<-tick.C
	}
}

// A plugin that needs to know which pod it allocates for (to label the
// device with it, say) reads the pod from its call's context; a manager
// with SendPodInfo names it there.
func Example_podInfo() {
	dir, _ := os.MkdirTemp("", "pt")
	defer os.RemoveAll(dir)
	mgr, _ := devicemanager.NewManagerImpl(devicemanager.Options{SocketDir: dir, SendPodInfo: true})
	_ = mgr.Start(nil, nil, nil, nil)
	defer mgr.Stop()

	p, _ := plugintest.New(plugintest.Options{
		ResourceName: "example.com/fpga",
		SocketDir:    dir,
		Devices:      []*pluginapi.Device{{ID: "fpga-0", Health: pluginapi.Healthy}},
	})
	defer p.Stop()
	p.SetAllocateFunc(func(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
		if pod, ok := podinfo.FromIncomingContext(ctx); ok {
			fmt.Printf("allocating for %s/%s (%s), container %s\n", pod.Namespace, pod.Name, pod.UID, pod.Container)
		}
		return p.DefaultAllocate(req), nil
	})
	_ = p.Start()
	_ = p.Register(filepath.Join(dir, devicemanager.KubeletSocketName))
	waitAllocatable(mgr, "example.com/fpga")

	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "job", Namespace: "default", UID: "uid-7"},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "main", Resources: v1.ResourceRequirements{
			Limits: v1.ResourceList{"example.com/fpga": resource.MustParse("1")},
		}}}},
	}
	_ = mgr.Allocate(context.Background(), pod, &pod.Spec.Containers[0])
	// Output:
	// allocating for default/job (uid-7), container main
}

package devicemanager_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/plugintest"
)

// An agent that scrubs a device (wipes its memory, resets it) once no
// container holds it: it reads Events until Stop closes the channel, then
// handles what the channel had not delivered, so that it misses no release.
func ExampleManagerImpl_Events() {
	dir, _ := os.MkdirTemp("", "dm")
	defer os.RemoveAll(dir)

	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: "default", UID: "uid-1"},
		Spec: v1.PodSpec{Containers: []v1.Container{{
			Name:      "trainer",
			Resources: v1.ResourceRequirements{Limits: v1.ResourceList{"example.com/gpu": resource.MustParse("2")}},
		}}},
	}
	var mu sync.Mutex
	active := []*v1.Pod{pod}
	activePods := func() []*v1.Pod {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(active)
	}

	mgr, err := devicemanager.NewManagerImpl(devicemanager.Options{SocketDir: dir, Events: true})
	if err != nil {
		panic(err)
	}
	handle := func(ev devicemanager.Event) {
		switch ev.Kind {
		case devicemanager.EventAdmitted:
			fmt.Println(ev.PodUID, ev.ContainerName, "got", ev.ResourceName, ev.DeviceIDs)
		case devicemanager.EventReleased:
			for _, id := range ev.DeviceIDs {
				fmt.Println("scrub", ev.ResourceName, id, "released by", ev.PodUID, ev.ContainerName, ev.Reason)
			}
		}
	}
	// The agent: one goroutine, ended by the channel's close.
	agentDone := make(chan struct{})
	go func() {
		defer close(agentDone)
		for ev := range mgr.Events() {
			handle(ev)
		}
	}()
	if err := mgr.Start(activePods, nil, nil, nil); err != nil {
		panic(err)
	}

	plugin, _ := plugintest.New(plugintest.Options{
		ResourceName: "example.com/gpu",
		SocketDir:    dir,
		Devices: []*pluginapi.Device{
			{ID: "gpu-0", Health: pluginapi.Healthy}, {ID: "gpu-1", Health: pluginapi.Healthy},
		},
	})
	defer plugin.Stop()
	_ = plugin.Start()
	_ = plugin.Register(dir + "/kubelet.sock")
	// Both devices count once the plugin's first ListAndWatch message is in.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for _, allocatable, _ := mgr.GetCapacity(); allocatable.Name("example.com/gpu", resource.DecimalSI).Value() < 2; _, allocatable, _ = mgr.GetCapacity() {
		<-tick.C
	}

	if err := mgr.Allocate(context.Background(), pod, &pod.Spec.Containers[0]); err != nil {
		panic(err)
	}
	// The pod ends; garbage collection releases its devices.
	mu.Lock()
	active = nil
	mu.Unlock()
	mgr.UpdateAllocatedDevices()

	// Stop does not wait for the agent: what it has not received yet is
	// handled after.
	_ = mgr.Stop()
	<-agentDone
	for _, ev := range mgr.UndeliveredEvents() {
		handle(ev)
	}
	// Output:
	// uid-1 trainer got example.com/gpu [gpu-0 gpu-1]
	// scrub example.com/gpu gpu-0 released by uid-1 trainer PodInactive
	// scrub example.com/gpu gpu-1 released by uid-1 trainer PodInactive
}

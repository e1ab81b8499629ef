package devicemanager

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/checkpoint"
	"github.com/openkubelet/devmgr/plugintest"
	"github.com/openkubelet/devmgr/podstate"
	"github.com/openkubelet/devmgr/topology"
)

// The benchmarks of the paths the kubelet spends most on: admissions over
// 1,000 pods, device updates of 10,000 devices with 0 and 1,000 pods, and a
// start on a 1,000-pod checkpoint. bench/ compares them with the kubelet.

// quiet silences the manager (a zero Logger would mean klog.Background()).
func quiet(o *Options) { o.Logger = logr.New(nullSink{}) }

type nullSink struct{}

func (nullSink) Init(logr.RuntimeInfo)            {}
func (nullSink) Enabled(int) bool                 { return false }
func (nullSink) Info(int, string, ...any)         {}
func (nullSink) Error(error, string, ...any)      {}
func (n nullSink) WithValues(...any) logr.LogSink { return n }
func (n nullSink) WithName(string) logr.LogSink   { return n }

func numbered(prefix string, n int) []*pluginapi.Device {
	out := make([]*pluginapi.Device, n)
	for i := range out {
		out[i] = &pluginapi.Device{ID: fmt.Sprintf("%s%05d", prefix, i), Health: pluginapi.Healthy}
	}
	return out
}

// BenchmarkAdmit1000Pods admits 1,000 pods of one device each on 1,000
// devices, through a real plugin; each pod's admission is on disk before
// Allocate returns. Reported per pod: p50, the mean of the first 100 and of
// the last 100.
func BenchmarkAdmit1000Pods(b *testing.B) {
	const n = 1000
	var all []time.Duration
	var first, last time.Duration
	for range b.N {
		b.StopTimer()
		h := newHarness(b, quiet).start()
		h.registered(res1, numbered("dev", n))
		pods := make([]*v1.Pod, n)
		for i := range pods {
			pods[i] = newPod(fmt.Sprintf("pod-%04d", i), ctr("app", res1, 1))
		}
		h.pods.add(pods...)
		b.StartTimer()
		for i, pod := range pods {
			start := time.Now()
			if err := h.m.Allocate(context.Background(), pod, &pod.Spec.Containers[0]); err != nil {
				b.Fatal(err)
			}
			d := time.Since(start)
			all = append(all, d)
			switch {
			case i < 100:
				first += d
			case i >= n-100:
				last += d
			}
		}
		b.StopTimer()
		require0(b, h.m.Stop())
	}
	slices.Sort(all)
	b.ReportMetric(float64(all[len(all)/2].Nanoseconds()), "p50-ns/pod")
	b.ReportMetric(float64(all[len(all)*99/100].Nanoseconds()), "p99-ns/pod")
	b.ReportMetric(float64(first.Nanoseconds())/float64(100*b.N), "first100-ns/pod")
	b.ReportMetric(float64(last.Nanoseconds())/float64(100*b.N), "last100-ns/pod")
}

func require0(b *testing.B, err error) {
	b.Helper()
	if err != nil {
		b.Fatal(err)
	}
}

// BenchmarkDeviceUpdate applies ListAndWatch messages of 10,000 devices,
// each making a fresh random tenth of them unhealthy (1,000 and 900
// alternately, so the healthy set always changes and no state comes back),
// with 0 and with 1,000 pods holding devices, through
// PluginListAndWatchReceiver; each message is built afresh outside the
// timer, as a stream's decoder makes it. The cost includes finding the pods
// to notify and writing the checkpoint.
func BenchmarkDeviceUpdate(b *testing.B) {
	for _, pods := range []int{0, 1000} {
		b.Run(fmt.Sprintf("pods=%d", pods), func(b *testing.B) {
			h := newHarness(b, quiet).start()
			devs := make([]*pluginapi.Device, 10000)
			for i := range devs {
				devs[i] = dev(fmt.Sprintf("GPU-%08x-5e1f-4c1a-9b0d-%012x", uint32(i)*2654435761, i), pluginapi.Healthy, int64(i%2))
			}
			h.registered(res1, devs)
			h.admitPods(b, pods)
			go drain(h.m.Updates())
			rng := rand.New(rand.NewPCG(1, 2))
			message := func(i int) []*pluginapi.Device {
				out := make([]*pluginapi.Device, len(devs))
				for j, d := range devs {
					out[j] = &pluginapi.Device{ID: d.ID, Health: d.Health, Topology: d.Topology}
				}
				for _, j := range rng.Perm(len(devs))[:1000-100*(i%2)] {
					out[j].Health = pluginapi.Unhealthy
				}
				return out
			}
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				b.StopTimer()
				msg := message(i)
				i++
				b.StartTimer()
				h.m.PluginListAndWatchReceiver(h.opts.Logger, res1, &pluginapi.ListAndWatchResponse{Devices: msg})
			}
		})
	}
}

// BenchmarkDeviceListReplaced applies lists of 10,000 devices whose IDs all
// differ from the previous list's (two such lists, alternately), with no
// pod allocated: every device is new, as in a plugin's first list.
func BenchmarkDeviceListReplaced(b *testing.B) {
	h := newHarness(b, quiet).start()
	a, c := numbered("a", 10000), numbered("c", 10000)
	h.registered(res1, a)
	applyAlternately(b, h, res1, c, a)
}

// applyAlternately times res's lists, as its primary instance's messages,
// one after the other and round again.
func applyAlternately(b *testing.B, h *harness, res string, lists ...[]*pluginapi.Device) {
	h.m.mu.Lock()
	ep := h.m.core.resources[res].primary
	h.m.mu.Unlock()
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		h.m.onDevices(res, ep, lists[i%len(lists)])
		i++
	}
}

func drain(ch <-chan ResourceUpdate) {
	for range ch { //nolint:revive // discard until Stop closes the channel
	}
}

// BenchmarkStartWith1000PodCheckpoint starts a manager on a checkpoint of
// 1,000 pods, until GetCapacity answers.
func BenchmarkStartWith1000PodCheckpoint(b *testing.B) {
	h := newHarness(b, quiet)
	ledger := podstate.NewLedger()
	healthy := make([]string, 1000)
	for i := range 1000 {
		healthy[i] = fmt.Sprintf("dev%05d", i)
		ledger.Insert(fmt.Sprintf("pod-%04d", i), "app", res1, checkpoint.DevicesPerNUMA{int64(i % 2): {healthy[i]}},
			&pluginapi.ContainerAllocateResponse{Envs: map[string]string{"DEV": healthy[i]},
				Devices: []*pluginapi.DeviceSpec{{ContainerPath: "/dev/x", HostPath: "/dev/" + healthy[i], Permissions: "rw"}}})
	}
	entries, err := ledger.ToCheckpoint()
	require0(b, err)
	store, err := checkpoint.NewManager(h.dir)
	require0(b, err)
	require0(b, store.CreateCheckpoint(checkpoint.DeviceManagerKey, checkpoint.New(entries, map[string][]string{res1: healthy})))

	b.ReportAllocs()
	for range b.N {
		m, err := NewManagerImpl(h.opts)
		require0(b, err)
		require0(b, m.Start(nil, nil, nil, nil))
		if c, _, _ := m.GetCapacity(); len(c) != 1 {
			b.Fatalf("capacity %v", c)
		}
		b.StopTimer()
		require0(b, m.Stop())
		if m.core.ledger.Len() != 1000 {
			b.Fatalf("restored %d pods", m.core.ledger.Len())
		}
		b.StartTimer()
	}
}

// BenchmarkAdmitTwoResources admits 500 pods of each of two resources, from
// one goroutine (alternating) and from two (one per resource): with group
// commit, admissions running side by side share checkpoint writes.
func BenchmarkAdmitTwoResources(b *testing.B) {
	for _, workers := range []int{1, 2} {
		b.Run(fmt.Sprintf("goroutines=%d", workers), func(b *testing.B) {
			const n = 500
			for range b.N {
				b.StopTimer()
				h := newHarness(b, quiet).start()
				h.registered(res1, numbered("a", n), func(o *plugintest.Options) { o.Endpoint = "a.sock" })
				h.registered(res2, numbered("b", n), func(o *plugintest.Options) { o.Endpoint = "b.sock" })
				pods := map[string][]*v1.Pod{}
				for _, res := range []string{res1, res2} {
					for i := range n {
						p := newPod(fmt.Sprintf("%s-%04d", res[:7], i), ctr("app", res, 1))
						pods[res] = append(pods[res], p)
						h.pods.add(p)
					}
				}
				admit := func(p *v1.Pod) {
					if err := h.m.Allocate(context.Background(), p, &p.Spec.Containers[0]); err != nil {
						b.Error(err)
					}
				}
				b.StartTimer()
				if workers == 1 {
					for i := range n {
						admit(pods[res1][i])
						admit(pods[res2][i])
					}
				} else {
					var wg sync.WaitGroup
					for _, res := range []string{res1, res2} {
						wg.Add(1)
						go func() {
							defer wg.Done()
							for _, p := range pods[res] {
								admit(p)
							}
						}()
					}
					wg.Wait()
				}
				b.StopTimer()
				require0(b, h.m.Stop())
			}
			b.ReportMetric(float64(2*n*b.N)/b.Elapsed().Seconds(), "pods/s")
		})
	}
}

// BenchmarkSelectionInput builds what device selection works from, and picks
// the device, for a container asking for one device of a resource with
// 10,000 devices, 1,000 of them held by pods and 1,000 unhealthy, with no
// NUMA affinity: the part of every admission that grows with the resource's
// devices.
func BenchmarkSelectionInput(b *testing.B) {
	h := newHarness(b, quiet).start()
	devs := numbered("dev", 10000)
	for i := range 1000 {
		devs[len(devs)-1-i].Health = pluginapi.Unhealthy
	}
	h.registered(res1, devs)
	h.admitPods(b, 1000)
	b.ReportAllocs()
	for b.Loop() {
		h.m.mu.Lock()
		in, _, err := h.m.selectionLocked("probe", "app", res1, 1, nil)
		var ids []string
		free := -1
		if err == nil {
			free = in.Available.Len()
			ids, err = podstate.Select(in, nil)
		}
		h.m.mu.Unlock()
		if err != nil || free != 8000 || len(ids) != 1 {
			b.Fatalf("%d free devices, %v picked, error %v", free, ids, err)
		}
	}
}

// BenchmarkAdmitOnManyDevices admits one pod asking for one device of a
// resource whose plugin advertises 80,000 IDs (shared GPUs), 1,000 of them
// held, until its admission is on disk; the pod is then removed (no write)
// so that every admission sees the same ledger.
func BenchmarkAdmitOnManyDevices(b *testing.B) { benchAdmitOnManyDevices(b, manyDevices{}) }

// BenchmarkAdmitOnManyDevicesPreferred is the same with a plugin that answers
// GetPreferredAllocation, which is sent every free device, and 100 devices
// held (admitting 1,000 pods first took a minute).
func BenchmarkAdmitOnManyDevicesPreferred(b *testing.B) {
	benchAdmitOnManyDevices(b, manyDevices{preferred: true})
}

// BenchmarkAdmitOnManyDevicesAffinity is BenchmarkAdmitOnManyDevices with the
// devices on two NUMA nodes and every container aligned on node 0 by the
// topology manager, and 100 devices held.
func BenchmarkAdmitOnManyDevicesAffinity(b *testing.B) {
	benchAdmitOnManyDevices(b, manyDevices{affinity: true})
}

// BenchmarkAdmitOnManyDevicesAffinityPreferred combines both: 80,000 IDs on
// two NUMA nodes, containers aligned on node 0, a plugin that answers
// GetPreferredAllocation (sent the 40,000 free devices of node 0, as the
// request fits there), 100 devices held.
func BenchmarkAdmitOnManyDevicesAffinityPreferred(b *testing.B) {
	benchAdmitOnManyDevices(b, manyDevices{affinity: true, preferred: true})
}

type manyDevices struct{ preferred, affinity bool }

type nodeZero struct{}

func (nodeZero) GetAffinity(string, string) topology.Hint {
	m, _ := topology.NewBitMask(0)
	return topology.Hint{NUMANodeAffinity: &m, Preferred: true}
}

func benchAdmitOnManyDevices(b *testing.B, how manyDevices) {
	h := newHarness(b, quiet, func(o *Options) {
		if how.affinity {
			o.AffinityStore, o.NUMANodes = nodeZero{}, []int{0, 1}
		}
	}).start()
	devs := make([]*pluginapi.Device, 80000)
	for i := range devs {
		devs[i] = &pluginapi.Device{ID: fmt.Sprintf("GPU-%08x-1b2d-4e5f-8a9b-%012d", i/8, i), Health: pluginapi.Healthy}
		if how.affinity {
			devs[i].Topology = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(i % 2)}}}
		}
	}
	h.registered(res1, devs, func(o *plugintest.Options) { o.GetPreferredAllocationAvailable = how.preferred })
	held := 1000
	if how.preferred || how.affinity {
		held = 100
	}
	h.admitPods(b, held)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		h.admitProbe(b, i)
		h.m.UpdateAllocatedDevices()
	}
}

// BenchmarkAdmitAfterPodGone: with 1,000 pods holding a device each, every
// admission finds the pod admitted before it gone from the active pods and
// drops its records (pod churn on a full node): with one device free, an
// admission that did not would fail.
func BenchmarkAdmitAfterPodGone(b *testing.B) {
	h := newHarness(b, quiet).start()
	h.registered(res1, numbered("dev", 1001))
	h.admitPods(b, 1000)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		h.admitProbe(b, i)
	}
}

// admitProbe admits the i-th probe pod, asking for one device of res1, and
// takes it out of the active pods again.
func (h *harness) admitProbe(b *testing.B, i int) {
	pod := newPod(fmt.Sprintf("probe-%d", i), ctr("app", res1, 1))
	h.pods.add(pod)
	require0(b, h.m.Allocate(context.Background(), pod, &pod.Spec.Containers[0]))
	h.pods.remove(pod.UID)
}

// BenchmarkStatusManyDevices: Status on a resource of 80,000 device IDs,
// 100 of them allocated; the answer lists every device in ID order.
func BenchmarkStatusManyDevices(b *testing.B) {
	h := newHarness(b, quiet).start()
	devs := make([]*pluginapi.Device, 80000)
	for i := range devs {
		devs[i] = &pluginapi.Device{ID: fmt.Sprintf("GPU-%08x-1b2d-4e5f-8a9b-%012d", i/8, i), Health: pluginapi.Healthy}
	}
	h.registered(res1, devs)
	h.admitPods(b, 100)
	b.ReportAllocs()
	for b.Loop() {
		st := h.m.Status()
		if len(st) != 1 || len(st[0].Devices) != len(devs) || st[0].Allocated != 100 {
			b.Fatalf("Status: %d resources, want 1 with %d devices and 100 allocated", len(st), len(devs))
		}
	}
}

// admitPods admits n pods named pod-0000, pod-0001..., each with one
// container asking for one device of res1, and adds them to the active pods.
func (h *harness) admitPods(b *testing.B, n int) {
	for i := range n {
		pod := newPod(fmt.Sprintf("pod-%04d", i), ctr("app", res1, 1))
		h.pods.add(pod)
		require0(b, h.m.Allocate(context.Background(), pod, &pod.Spec.Containers[0]))
	}
}

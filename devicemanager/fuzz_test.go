package devicemanager

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/checkpoint"
	"github.com/openkubelet/devmgr/endpoint"
	"github.com/openkubelet/devmgr/internal/pluginreg"
	"github.com/openkubelet/devmgr/plugintest"
	"github.com/openkubelet/devmgr/topology"
)

// Fuzz targets for what the manager reads from the wire: registration
// requests and ListAndWatch device lists. Their seed corpora run as plain
// tests; `go test -run '^$' -fuzz FuzzX ./devicemanager` explores further.
// Each target shares one started manager across its inputs (a manager per
// input would measure gRPC setup, not the code under test); the manager logs
// nowhere, since a fuzz input must not log through *testing.F.

// fuzzWait bounds the waits of a fuzz target's setup.
const fuzzWait = 20 * time.Second

// fuzzDir returns a short directory for sockets, removed at cleanup.
func fuzzDir(f *testing.F, where string) string {
	f.Helper()
	dir, err := os.MkdirTemp(where, "fz")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// fuzzFastDir is a checkpoint directory on tmpfs when there is one: every
// input may write the checkpoint, and fsync would dominate.
func fuzzFastDir(f *testing.F) string {
	f.Helper()
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		return fuzzDir(f, "/dev/shm")
	}
	return fuzzDir(f, "")
}

// fuzzPlugin starts a plugintest plugin that logs nowhere, stopped at cleanup.
func fuzzPlugin(f *testing.F, o plugintest.Options) *plugintest.Plugin {
	f.Helper()
	o.Logger = logr.New(nullSink{})
	p, err := plugintest.New(o)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(p.Stop)
	if err := p.Start(); err != nil {
		f.Fatal(err)
	}
	return p
}

// fuzzPods is a mutable active pod list.
type fuzzPods struct {
	mu   sync.Mutex
	pods map[types.UID]*v1.Pod
}

func (p *fuzzPods) set(pod *v1.Pod, active bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if active {
		p.pods[pod.UID] = pod
	} else {
		delete(p.pods, pod.UID)
	}
}

func (p *fuzzPods) list() []*v1.Pod {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*v1.Pod, 0, len(p.pods))
	for _, pod := range p.pods {
		out = append(out, pod)
	}
	return out
}

// fuzzManager starts a manager in a short directory with its checkpoint in
// cpDir, stopped at cleanup.
func fuzzManager(f *testing.F, opts Options, pods *fuzzPods) *ManagerImpl {
	f.Helper()
	opts.Logger = logr.New(nullSink{}) // logr.Discard() has a nil sink: "unset", klog.Background()
	m, err := NewManagerImpl(opts)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = m.Stop() })
	if err := m.Start(pods.list, nil, nil, nil); err != nil {
		f.Fatal(err)
	}
	return m
}

// fuzzUntil polls cond until it holds or fuzzWait passes.
func fuzzUntil(f *testing.F, cond func() bool, what string) {
	f.Helper()
	deadline := time.Now().Add(fuzzWait)
	for !cond() {
		if time.Now().After(deadline) {
			f.Fatalf("timed out waiting for %s", what)
		}
		t := time.NewTimer(time.Millisecond)
		<-t.C
	}
}

// The kubelet's rules for a resource name (an extended resource name), written from their text and
// not from the validation package, so that the two are checked against each
// other: a DNS-1123 subdomain prefix (lowercase alphanumerics, '-', '.'; at
// most 253 bytes counting the added "requests.") and a name part of at most
// 63 bytes of alphanumerics, '-', '_', '.', starting and ending with an
// alphanumeric.
var (
	specSubdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	specNamePart  = regexp.MustCompile(`^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$`)
)

func specExtendedResourceName(name string) bool {
	if !strings.Contains(name, "/") || strings.Contains(name, "kubernetes.io/") || strings.HasPrefix(name, "requests.") {
		return false
	}
	prefix, part, _ := strings.Cut("requests."+name, "/")
	if strings.Contains(part, "/") || len(prefix) > 253 || !specSubdomain.MatchString(prefix) {
		return false
	}
	return len(part) <= 63 && specNamePart.MatchString(part)
}

// specBareEndpoint is devmgr's rule for an endpoint: a file name in the socket
// directory, no '/', no NUL, not "", "." or "..", and the path must fit in
// a unix socket address (107 bytes).
func specBareEndpoint(dir, ep string) bool {
	if ep == "" || ep == "." || ep == ".." || strings.ContainsAny(ep, "/\x00") {
		return false
	}
	return len(dir)+1+len(ep) <= pluginreg.MaxSocketPath
}

// FuzzRegisterRequest feeds arbitrary version, resource name and endpoint
// strings to registration. The validation functions must agree with the
// kubelet's resource name rules and devmgr's endpoint rule (an independent reading of
// them); the plugin-registry path must agree with them; and the gRPC
// Register of a started manager must refuse exactly the invalid requests
// with exactly their validation error, and for valid ones either register
// (the endpoint of a serving plugin) or fail with a dial-back error. Nothing
// may panic.
func FuzzRegisterRequest(f *testing.F) {
	dir := fuzzDir(f, "")
	pods := &fuzzPods{pods: map[types.UID]*v1.Pod{}}
	m := fuzzManager(f, Options{SocketDir: dir, CheckpointDir: fuzzFastDir(f), DialTimeout: time.Second}, pods)
	p := fuzzPlugin(f, plugintest.Options{ResourceName: "example.com/fuzz", SocketDir: dir, Endpoint: "fz.sock",
		Devices: []*pluginapi.Device{{ID: "d0", Health: pluginapi.Healthy}}})
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, KubeletSocketName), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { conn.Close() })
	client := pluginapi.NewRegistrationClient(conn)
	handler := m.GetWatcherHandler()

	v := pluginapi.Version
	for _, s := range [][3]string{
		{v, "example.com/gpu", "fz.sock"},
		{v, "example.com/gpu", "missing.sock"},
		{v, "example.com/gpu", KubeletSocketName},
		{v, "example.com/gpu", checkpoint.DeviceManagerKey},
		{v, "example.com/gpu", "../fz.sock"},
		{v, "example.com/gpu", "a\x00b"},
		{v, "example.com/gpu", strings.Repeat("e", 200)},
		{v, "example.com/gpu", ""},
		{v, "example.com/gpu", ".."},
		{"", "example.com/gpu", "fz.sock"},
		{"v1beta1\x00", "example.com/gpu", "fz.sock"},
		{v, "gpu", "fz.sock"},
		{v, "kubernetes.io/gpu", "fz.sock"},
		{v, "a.kubernetes.io/gpu", "fz.sock"},
		{v, "requests.example.com/gpu", "fz.sock"},
		{v, "example.com/a/b", "fz.sock"},
		{v, "Example.com/gpu", "fz.sock"},
		{v, "example.com/", "fz.sock"},
		{v, "/gpu", "fz.sock"},
		{v, "example.com/" + strings.Repeat("g", 63), "fz.sock"},
		{v, "example.com/" + strings.Repeat("g", 64), "fz.sock"},
		{v, strings.Repeat("a", 244) + "/gpu", "fz.sock"},
		{v, strings.Repeat("a", 245) + "/gpu", "fz.sock"},
		{v, "example.com/gpu\n", "fz.sock"},
		{v, "example.com/g_p.u-1", "fz.sock"},
		{v, "example.com/gp\xffu", "fz.sock"},
	} {
		f.Add(s[0], s[1], s[2])
	}

	f.Fuzz(func(t *testing.T, version, name, ep string) {
		verr := pluginreg.CheckVersion(version)
		if (verr == nil) != (version == pluginapi.Version) {
			t.Fatalf("version %q: validateVersion says %v", version, verr)
		}
		if verr != nil {
			want := fmt.Sprintf("requested API version %q is not supported by kubelet. Supported version is [\"v1beta1\"]", version)
			if verr.Error() != want {
				t.Fatalf("version %q: error %q, want %q", version, verr, want)
			}
		}
		nerr := pluginreg.CheckResourceName(name)
		if valid := specExtendedResourceName(name); valid != (nerr == nil) {
			t.Fatalf("resource name %q: validateResourceName says %v, the rules say valid=%v", name, nerr, valid)
		}
		if nerr != nil && nerr.Error() != fmt.Sprintf("the ResourceName %q is invalid", name) {
			t.Fatalf("resource name %q: error %q", name, nerr)
		}
		path, eerr := pluginreg.EndpointPath(m.opts.SocketDir, ep)
		if valid := specBareEndpoint(dir, ep); valid != (eerr == nil) {
			t.Fatalf("endpoint %q: endpointPath says %v, the rule says valid=%v", ep, eerr, valid)
		}
		if eerr == nil && (path != dir+"/"+ep || filepath.Dir(path) != dir || filepath.Base(path) != ep) {
			t.Fatalf("endpoint %q: socket path %q leaves %s", ep, path, dir)
		}
		if eerr != nil && !strings.HasPrefix(eerr.Error(), fmt.Sprintf("invalid endpoint %q: ", ep)) {
			t.Fatalf("endpoint %q: error %q", ep, eerr)
		}
		werr := handler.ValidatePlugin(name, ep, []string{version})
		if (werr == nil) != (verr == nil && nerr == nil) {
			t.Fatalf("ValidatePlugin(%q, [%q]) = %v; version %v, name %v", name, version, werr, verr, nerr)
		}

		// Over gRPC: protobuf strings must be UTF-8, so other requests
		// cannot even be sent.
		if !utf8.ValidString(version) || !utf8.ValidString(name) || !utf8.ValidString(ep) {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), fuzzWait)
		defer cancel()
		_, err := client.Register(ctx, &pluginapi.RegisterRequest{Version: version, ResourceName: name, Endpoint: ep},
			grpc.WaitForReady(true))
		msg := status.Convert(err).Message()
		switch {
		case verr != nil, nerr != nil, eerr != nil:
			// Checked in this order: the first failure is the answer.
			first := cmp.Or(verr, nerr, eerr)
			if err == nil || msg != first.Error() {
				t.Fatalf("Register(%q, %q, %q) = %v, want %q", version, name, ep, err, first)
			}
		case ep == "fz.sock":
			if err != nil {
				t.Fatalf("Register(%q, %q, %q) of a serving plugin = %v", version, name, ep, err)
			}
			handler.DeRegisterPlugin(name, p.SocketPath())
		default:
			if err == nil || !strings.HasPrefix(msg, "failed to dial device plugin: ") &&
				!strings.HasPrefix(msg, "failed to get device plugin options: ") {
				t.Fatalf("Register(%q, %q, %q) of no plugin = %v", version, name, ep, err)
			}
		}
	})
}

// fuzzRes is the resource of FuzzDeviceUpdate.
const fuzzRes = "example.com/fuzz"

// fuzzNUMA are node ids a fuzzed device may report: the machine's (0, 1),
// other valid ones, -1 ("no topology"), and ids outside 0..63.
var fuzzNUMA = []int64{0, 1, 0, 1, -1, 2, 63, 64, -5, 99, 1 << 40, math.MinInt64, math.MaxInt64}

// fuzzHealth are health strings a fuzzed device may report; only the exact
// "Healthy" is healthy.
var fuzzHealth = []string{pluginapi.Healthy, pluginapi.Healthy, pluginapi.Healthy, pluginapi.Unhealthy,
	"", "healthy", "Healthy ", "\x00"}

// fuzzReader hands out the fuzz bytes; zeros once they run out.
type fuzzReader struct{ b []byte }

func (r *fuzzReader) byte() byte {
	if len(r.b) == 0 {
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

// str returns the next n bytes as a string a ListAndWatch message can
// carry: protobuf refuses invalid UTF-8 in a string field, on both ends, so
// invalid sequences become U+FFFD. (The checkpoint cannot hold invalid UTF-8
// either: JSON replaces it, and the checksum of what was written no longer
// matches what is read back.)
func (r *fuzzReader) str(n int) string {
	n = min(n, len(r.b))
	s := strings.ToValidUTF8(string(r.b[:n]), "\uFFFD")
	r.b = r.b[n:]
	return s
}

// raw returns the next n bytes as they are.
func (r *fuzzReader) raw(n int) []byte {
	n = min(n, len(r.b))
	b := r.b[:n]
	r.b = r.b[n:]
	return b
}

func (r *fuzzReader) int64() int64 {
	var buf [8]byte
	copy(buf[:], r.raw(8))
	return int64(binary.LittleEndian.Uint64(buf[:]))
}

// decodeDeviceLists turns fuzz bytes into one to three ListAndWatch device
// lists: up to 19 entries each, some nil; IDs mostly d0..d15 (the base list
// is d0..d11, so they collide with allocated devices and with each other),
// else raw bytes (NUL, control characters, empty; invalid UTF-8 made valid,
// see str); health from fuzzHealth or raw bytes; topology nil, empty, or one
// to three nodes from fuzzNUMA, raw 64-bit ids, or nil entries.
func decodeDeviceLists(data []byte) [][]*pluginapi.Device {
	r := &fuzzReader{b: data}
	lists := make([][]*pluginapi.Device, 1+int(r.byte()%3))
	for i := range lists {
		for range int(r.byte() % 20) {
			sel := r.byte()
			if sel == 0xff {
				lists[i] = append(lists[i], nil)
				continue
			}
			d := &pluginapi.Device{}
			if sel < 0x80 {
				d.ID = "d" + strconv.Itoa(int(sel%16))
			} else {
				d.ID = r.str(int(sel & 0x0f))
			}
			if h := r.byte(); h >= 0xf0 {
				d.Health = r.str(int(h & 0x07))
			} else {
				d.Health = fuzzHealth[int(h)%len(fuzzHealth)]
			}
			switch topo := r.byte(); topo % 4 {
			case 0:
			case 1:
				d.Topology = &pluginapi.TopologyInfo{}
			default:
				d.Topology = &pluginapi.TopologyInfo{}
				for range 1 + int(topo>>2)%3 {
					switch b := r.byte(); {
					case b == 0xff:
						d.Topology.Nodes = append(d.Topology.Nodes, nil)
					case b >= 0xc0:
						d.Topology.Nodes = append(d.Topology.Nodes, &pluginapi.NUMANode{ID: r.int64()})
					default:
						d.Topology.Nodes = append(d.Topology.Nodes, &pluginapi.NUMANode{ID: fuzzNUMA[int(b)%len(fuzzNUMA)]})
					}
				}
			}
			lists[i] = append(lists[i], d)
		}
	}
	return lists
}

// fuzzAffinity aligns the fuzz admissions on NUMA node 0.
type fuzzAffinity struct{}

func (fuzzAffinity) GetAffinity(podUID, _ string) topology.Hint {
	if !strings.HasPrefix(podUID, "fz-new") {
		return topology.Hint{}
	}
	mask, _ := topology.NewBitMask(0)
	return topology.Hint{NUMANodeAffinity: &mask, Preferred: true}
}

// fuzzFixture is a started manager whose resource fuzzRes has a connected
// plugin and two pods holding devices.
type fuzzFixture struct {
	m     *ManagerImpl
	cpDir string
	ep    *endpoint.Endpoint
	base  []*pluginapi.Device
	pods  *fuzzPods
	held  []*v1.Pod
	views map[types.UID]map[string][]int64 // pod -> device -> NUMA nodes, at setup
	store checkpoint.Manager
	// entries are the checkpoint entries of the held pods at setup.
	entries []checkpoint.PodDevicesEntry
	n       int // inputs run, for pod names
}

func newFuzzFixture(f *testing.F) *fuzzFixture {
	f.Helper()
	dir := fuzzDir(f, "")
	fx := &fuzzFixture{cpDir: fuzzFastDir(f), pods: &fuzzPods{pods: map[types.UID]*v1.Pod{}}}
	fx.m = fuzzManager(f, Options{SocketDir: dir, CheckpointDir: fx.cpDir, NUMANodes: []int{0, 1},
		AffinityStore: fuzzAffinity{}}, fx.pods)
	for i := range 12 {
		fx.base = append(fx.base, dev("d"+strconv.Itoa(i), healthy, int64(i%2)))
	}
	p := fuzzPlugin(f, plugintest.Options{ResourceName: fuzzRes, SocketDir: dir, Devices: fx.base})
	if err := p.Register(filepath.Join(dir, KubeletSocketName)); err != nil {
		f.Fatal(err)
	}
	fuzzUntil(f, func() bool {
		fx.m.mu.Lock()
		defer fx.m.mu.Unlock()
		r := fx.m.core.resources[fuzzRes]
		if r != nil && r.healthyLen() == len(fx.base) {
			fx.ep = r.primary
		}
		return fx.ep != nil
	}, "the plugin's device list")

	fx.views = map[types.UID]map[string][]int64{}
	for _, held := range []struct {
		uid string
		n   int
	}{{"fz-a", 2}, {"fz-b", 3}} {
		pod := newPod(held.uid, ctr("c", fuzzRes, held.n))
		fx.pods.set(pod, true)
		if err := fx.m.Allocate(context.Background(), pod, &pod.Spec.Containers[0]); err != nil {
			f.Fatal(err)
		}
		fx.held = append(fx.held, pod)
		fx.views[pod.UID] = numaView(fx.m.GetDevices(held.uid, "c")[fuzzRes])
	}
	var err error
	if fx.store, err = checkpoint.NewManager(fx.cpDir); err != nil {
		f.Fatal(err)
	}
	fx.entries, _ = fx.readCheckpoint(f)
	return fx
}

// numaView returns each device's NUMA node ids.
func numaView(devs DeviceInstances) map[string][]int64 {
	out := make(map[string][]int64, len(devs))
	for id, d := range devs {
		var nodes []int64
		for _, n := range d.GetTopology().GetNodes() {
			nodes = append(nodes, n.ID)
		}
		out[id] = nodes
	}
	return out
}

// readCheckpoint reads and verifies the checkpoint, and returns the entries
// of the held pods and the registered devices.
func (fx *fuzzFixture) readCheckpoint(tb testing.TB) ([]checkpoint.PodDevicesEntry, map[string][]string) {
	cp := checkpoint.New(nil, nil)
	if err := fx.store.GetCheckpoint(checkpoint.DeviceManagerKey, cp); err != nil {
		tb.Fatalf("checkpoint: %v", err)
	}
	entries, registered := cp.GetData()
	var held []checkpoint.PodDevicesEntry
	for _, e := range entries {
		if e.PodUID == "fz-a" || e.PodUID == "fz-b" {
			held = append(held, e)
		}
	}
	return held, registered
}

// check verifies the invariants after the device list devs was applied.
func (fx *fuzzFixture) check(t *testing.T, devs []*pluginapi.Device) {
	want := map[string]*pluginapi.Device{} // the last entry of an ID wins
	for _, d := range devs {
		if d != nil {
			want[d.ID] = d
		}
	}
	wantHealthy, wantUnhealthy := sets.New[string](), sets.New[string]()
	for id, d := range want {
		if d.Health == pluginapi.Healthy {
			wantHealthy.Insert(id)
		} else {
			wantUnhealthy.Insert(id)
		}
	}
	m := fx.m
	m.mu.Lock()
	r := m.core.resources[fuzzRes]
	healthy, unhealthy, wrong := healthIDs(r)
	known := sets.KeySet(r.deviceMap())
	pending := m.core.ledger.Pending()
	m.mu.Unlock()
	if wrong != "" {
		t.Fatal(wrong)
	}
	if !healthy.Equal(wantHealthy) || !unhealthy.Equal(wantUnhealthy) || !known.Equal(sets.KeySet(want)) {
		t.Fatalf("healthy %q unhealthy %q known %q; the list says healthy %q unhealthy %q",
			sets.List(healthy), sets.List(unhealthy), sets.List(known), sets.List(wantHealthy), sets.List(wantUnhealthy))
	}
	if pending != 0 {
		t.Fatalf("%d reservations pending", pending)
	}
	capacity, allocatable, _ := m.GetCapacity()
	c, a := capacity[fuzzRes], allocatable[fuzzRes]
	if c.Value() != int64(len(want)) || a.Value() != int64(wantHealthy.Len()) {
		t.Fatalf("capacity %d allocatable %d; want %d and %d", c.Value(), a.Value(), len(want), wantHealthy.Len())
	}
	if got := sets.KeySet(m.GetAllocatableDevices()[fuzzRes]); !got.Equal(wantHealthy) {
		t.Fatalf("allocatable devices %q, want %q", sets.List(got), sets.List(wantHealthy))
	}
	for _, pod := range fx.held {
		got := numaView(m.GetDevices(string(pod.UID), "c")[fuzzRes])
		if !mapsEqualNUMA(got, fx.views[pod.UID]) {
			t.Fatalf("pod %s holds %v, held %v before the update", pod.UID, got, fx.views[pod.UID])
		}
		st := &v1.PodStatus{ContainerStatuses: []v1.ContainerStatus{{Name: "c"}}}
		m.UpdateAllocatedResourcesStatus(pod, st)
		for _, rs := range st.ContainerStatuses[0].AllocatedResourcesStatus {
			for _, h := range rs.Resources {
				d, listed := want[string(h.ResourceID)]
				wantH := v1.ResourceHealthStatusHealthy
				if listed && d.Health != pluginapi.Healthy {
					wantH = v1.ResourceHealthStatusUnhealthy
				}
				if h.Health != wantH {
					t.Fatalf("pod %s device %q health %s, want %s", pod.UID, h.ResourceID, h.Health, wantH)
				}
			}
		}
	}
	entries, registered := fx.readCheckpoint(t)
	if !slices.EqualFunc(entries, fx.entries, entryEqual) {
		t.Fatalf("checkpoint entries of the held pods changed: %v, were %v", entries, fx.entries)
	}
	if got := registered[fuzzRes]; !slices.Equal(got, sets.List(wantHealthy)) && (len(got) != 0 || wantHealthy.Len() != 0) {
		t.Fatalf("checkpoint registers %q, healthy are %q", got, sets.List(wantHealthy))
	}
	for _, n := range []int{1, 3} {
		probe := newPod("fz-probe", ctr("c", fuzzRes, n))
		for _, h := range m.GetTopologyHints(probe, &probe.Spec.Containers[0])[fuzzRes] {
			if h.NUMANodeAffinity != nil && (h.NUMANodeAffinity.IsEmpty() || uint64(*h.NUMANodeAffinity)&^0b11 != 0) {
				t.Fatalf("hint %v names nodes the machine does not have", h)
			}
		}
	}
}

func mapsEqualNUMA(a, b map[string][]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || !slices.Equal(v, w) {
			return false
		}
	}
	return true
}

func entryEqual(a, b checkpoint.PodDevicesEntry) bool {
	if a.PodUID != b.PodUID || a.ContainerName != b.ContainerName || a.ResourceName != b.ResourceName ||
		string(a.AllocResp) != string(b.AllocResp) || len(a.DeviceIDs) != len(b.DeviceIDs) {
		return false
	}
	for k, v := range a.DeviceIDs {
		if !slices.Equal(v, b.DeviceIDs[k]) {
			return false
		}
	}
	return true
}

// FuzzDeviceUpdate applies arbitrary ListAndWatch device lists (decoded from
// the fuzz bytes by decodeDeviceLists: duplicate and empty IDs, invalid
// UTF-8 as protobuf delivers it, odd health strings, NUMA ids outside 0..63,
// nil entries) to a
// resource whose plugin is connected and whose devices two pods hold, as the
// stream's receiver does (onDevices with the current endpoint). After each
// list: healthy and unhealthy are disjoint and are exactly what the list
// says, capacity is their sum and allocatable the healthy count, the held
// pods hold what they held, their health in pod status follows the list,
// the checkpoint verifies with the held pods' entries unchanged and the
// healthy IDs registered, and hints name machine nodes only. Then a new pod
// is admitted against the last list (aligned on node 0): it gets healthy
// devices nobody holds, or a refusal that leaves nothing behind; then it is
// released, and the base list restored. Nothing may panic.
func FuzzDeviceUpdate(f *testing.F) {
	fx := newFuzzFixture(f)
	f.Add([]byte{})
	f.Add([]byte{0, 12, 0, 0, 0, 1, 0, 0, 2, 0, 0, 3, 0, 0, 4, 0, 0, 5, 0, 0, 6, 0, 0, 7, 0, 0, 8, 0, 0, 9, 0, 0, 10, 0, 0, 11, 0, 0})
	f.Add([]byte{1, 3, 0, 0, 0, 0, 3, 0, 0, 0, 0, 2, 1, 0, 0, 3, 1})                  // d0 twice, healthy then not; then d1
	f.Add([]byte{0, 4, 0x80, 0, 0, 0x83, 0, 'x', 0xff, 0xfe, 0, 0, 0xff, 1, 2, 0, 1}) // "" and invalid UTF-8 IDs, a nil entry
	f.Add([]byte{0, 3, 1, 0, 2, 7, 0, 6, 10, 8, 2, 0, 14, 11, 12, 9, 3, 0, 2, 0xc5, 1, 2, 3, 4, 5, 6, 7, 0x80})
	f.Add([]byte{2, 2, 0, 0xf3, 'o', 'k', '?', 1, 5, 4, 6, 1, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{0, 5, 12, 0, 2, 0, 13, 0, 2, 1, 14, 0, 2, 0, 15, 0, 2, 1, 11, 5, 2, 0xff}) // new IDs on both nodes
	f.Add([]byte("00\xc9\x8f"))                                                             // the ID "\x8f", made U+FFFD
	f.Fuzz(func(t *testing.T, data []byte) {
		fx.n++
		m := fx.m
		var last []*pluginapi.Device
		for _, devs := range decodeDeviceLists(data) {
			m.onDevices(fuzzRes, fx.ep, devs)
			fx.check(t, devs)
			last = devs
		}
		if len(data) > 0 {
			fx.admitNew(t, last, 1+int(data[len(data)-1])%3)
		}
		m.onDevices(fuzzRes, fx.ep, fx.base)
		fx.check(t, fx.base)
	})
}

// admitNew admits a pod asking n devices against the list devs, checks the
// outcome, and releases it.
func (fx *fuzzFixture) admitNew(t *testing.T, devs []*pluginapi.Device, n int) {
	m := fx.m
	uid := fmt.Sprintf("fz-new-%d", fx.n)
	pod := newPod(uid, ctr("c", fuzzRes, n))
	fx.pods.set(pod, true)
	err := m.Allocate(context.Background(), pod, &pod.Spec.Containers[0])
	got := m.GetDevices(uid, "c")
	if err != nil {
		switch {
		case errors.Is(err, ErrInsufficientDevices), errors.Is(err, ErrNoHealthyDevices), errors.Is(err, ErrPluginCall):
		default:
			t.Fatalf("admission refused with an unexpected error: %v", err)
		}
		if got != nil {
			t.Fatalf("refused admission (%v) holds %v", err, got)
		}
	} else {
		healthyNow := sets.New[string]()
		for _, d := range devs {
			if d != nil {
				healthyNow.Delete(d.ID)
				if d.Health == pluginapi.Healthy {
					healthyNow.Insert(d.ID)
				}
			}
		}
		ids := sets.KeySet(got[fuzzRes])
		if ids.Len() != n {
			t.Fatalf("asked %d devices, got %q", n, sets.List(ids))
		}
		if !healthyNow.IsSuperset(ids) {
			t.Fatalf("allocated %q, healthy are %q", sets.List(ids), sets.List(healthyNow))
		}
		for _, other := range fx.held {
			for id := range fx.views[other.UID] {
				if ids.Has(id) {
					t.Fatalf("allocated %q, held by %s", id, other.UID)
				}
			}
		}
	}
	fx.pods.set(pod, false)
	m.UpdateAllocatedDevices()
	if got := m.GetDevices(uid, "c"); got != nil {
		t.Fatalf("released pod holds %v", got)
	}
}

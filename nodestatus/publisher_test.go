package nodestatus_test

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/openkubelet/devmgr/nodestatus"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const node = "edge-1"

// fakeManager reports the capacity a test sets, and counts its reads: the
// publisher reads capacity once at the start of each round.
type fakeManager struct {
	mu          sync.Mutex
	capacity    map[v1.ResourceName]int64
	allocatable map[v1.ResourceName]int64
	reads       int
	wiped       bool
}

func (f *fakeManager) set(name v1.ResourceName, capacity, allocatable int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.capacity == nil {
		f.capacity, f.allocatable = map[v1.ResourceName]int64{}, map[v1.ResourceName]int64{}
	}
	f.capacity[name], f.allocatable[name] = capacity, allocatable
}

func (f *fakeManager) drop(name v1.ResourceName) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.capacity, name)
	delete(f.allocatable, name)
}

func (f *fakeManager) GetCapacity() (capacity, allocatable v1.ResourceList, removed []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	capacity, allocatable = v1.ResourceList{}, v1.ResourceList{}
	for name, n := range f.capacity {
		capacity[name] = *resource.NewQuantity(n, resource.DecimalSI)
		allocatable[name] = *resource.NewQuantity(f.allocatable[name], resource.DecimalSI)
	}
	return capacity, allocatable, nil
}

func (f *fakeManager) ShouldResetExtendedResourceCapacity() bool { return f.wiped }

func (f *fakeManager) readCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reads
}

// harness runs a Publisher on a fake clock against a fake clientset that
// implements server-side apply.
type harness struct {
	t       *testing.T
	clk     *testingclock.FakeClock
	mgr     *fakeManager
	client  *fake.Clientset
	metrics *nodestatus.Metrics
	reg     *prometheus.Registry
	cancel  context.CancelFunc
	done    chan error
	rounds  int
}

func newHarness(t *testing.T, mgr *fakeManager, opts nodestatus.Options, objects ...runtime.Object) *harness {
	t.Helper()
	return prepare(t, mgr, objects...).start(opts)
}

// prepare makes the harness without starting the publisher, so that a test
// can add reactors to the client first.
func prepare(t *testing.T, mgr *fakeManager, objects ...runtime.Object) *harness {
	t.Helper()
	h := &harness{t: t, clk: testingclock.NewFakeClock(time.Unix(1_700_000_000, 0)), mgr: mgr,
		client: fake.NewClientset(objects...), reg: prometheus.NewRegistry()}
	var err error
	h.metrics, err = nodestatus.NewMetrics(h.reg)
	require.NoError(t, err)
	return h
}

func (h *harness) start(opts nodestatus.Options) *harness {
	opts.Client, opts.NodeName, opts.Manager = h.client, node, h.mgr
	opts.Clock, opts.Metrics = h.clk, h.metrics
	if opts.PollInterval == 0 {
		opts.PollInterval = time.Second
	}
	p, err := nodestatus.New(opts)
	require.NoError(h.t, err)
	return h.run(p)
}

func (h *harness) run(p *nodestatus.Publisher) *harness {
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel, h.done = cancel, make(chan error, 1)
	go func() { h.done <- p.Run(ctx) }()
	h.t.Cleanup(h.stop)
	h.awaitRound(0)
	return h
}

// stop ends Run and checks that it returned ctx's error.
func (h *harness) stop() {
	if h.cancel == nil {
		return
	}
	h.cancel()
	h.cancel = nil
	select {
	case err := <-h.done:
		require.ErrorIs(h.t, err, context.Canceled)
	case <-time.After(10 * time.Second):
		h.t.Fatal("Run did not return after its context ended")
	}
}

// awaitRound waits until round n has started: the manager was read n+1
// times (not counting the publisher's extra read after a reset).
func (h *harness) awaitRound(n int) {
	h.t.Helper()
	require.Eventually(h.t, func() bool { return h.mgr.readCount() >= n+1+h.extraReads() }, 10*time.Second, time.Millisecond,
		"round %d did not start", n)
}

func (h *harness) extraReads() int {
	if h.mgr.wiped {
		return 1
	}
	return 0
}

// next moves the clock one poll interval and returns once the round it
// started has started, so that the round before it has finished.
func (h *harness) next() {
	h.t.Helper()
	h.rounds++
	h.clk.Step(time.Second)
	h.awaitRound(h.rounds)
}

// settle finishes the current round: it runs the next one up to its start.
func (h *harness) settle() { h.next() }

func (h *harness) applies() int {
	n := 0
	for _, a := range h.client.Actions() {
		if a.GetVerb() == "patch" && a.GetResource().Resource == "nodes" && a.GetSubresource() == "status" {
			n++
		}
	}
	return n
}

// applied returns the capacity and allocatable of the publisher's apply
// number i (from 0), as it sent them.
func (h *harness) applied(i int) (capacity, allocatable map[v1.ResourceName]int64) {
	h.t.Helper()
	for _, a := range h.client.Actions() {
		p, ok := a.(k8stesting.PatchAction)
		if !ok || a.GetResource().Resource != "nodes" || a.GetSubresource() != "status" {
			continue
		}
		if i--; i < 0 {
			var n v1.Node
			require.NoError(h.t, json.Unmarshal(p.GetPatch(), &n))
			return counts(n.Status.Capacity), counts(n.Status.Allocatable)
		}
	}
	h.t.Fatalf("fewer applies than asked for")
	return nil, nil
}

func (h *harness) node() *v1.Node {
	h.t.Helper()
	n, err := h.client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	require.NoError(h.t, err)
	return n
}

func (h *harness) published(result string) int {
	return int(metricValue(h.t, h.reg, nodestatus.MetricPublishesTotal, result))
}

// metricValue returns the value of the counter or gauge name, of the series
// whose only label has the value label ("" for a metric without labels).
func metricValue(t *testing.T, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) == 0 && label == "" {
				return m.GetGauge().GetValue()
			}
			if len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == label {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no metric %s{%s}", name, label)
	return 0
}

func emptyNode() *v1.Node { return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}} }

func counts(l v1.ResourceList) map[v1.ResourceName]int64 {
	out := map[v1.ResourceName]int64{}
	for name, q := range l {
		out[name] = q.Value()
	}
	return out
}

func TestPublishesTheManagersCapacityAndAllocatable(t *testing.T) {
	mgr := &fakeManager{}
	mgr.set("example.com/gpu", 4, 3)
	h := newHarness(t, mgr, nodestatus.Options{}, emptyNode())
	h.settle()

	n := h.node()
	require.Equal(t, map[v1.ResourceName]int64{"example.com/gpu": 4}, counts(n.Status.Capacity))
	require.Equal(t, map[v1.ResourceName]int64{"example.com/gpu": 3}, counts(n.Status.Allocatable))
	require.Equal(t, 1, h.published("success"))
	require.Equal(t, 0, h.published("failure"))
	require.InDelta(t, float64(h.clk.Now().Add(-time.Second).Unix()), // round 0
		metricValue(t, h.reg, nodestatus.MetricLastPublishSecond, ""), 0.001)
}

func TestChangesWithinOnePollIntervalMakeOneWrite(t *testing.T) {
	mgr := &fakeManager{}
	mgr.set("example.com/gpu", 8, 8)
	h := newHarness(t, mgr, nodestatus.Options{}, emptyNode())
	h.settle()
	require.Equal(t, 1, h.applies())

	for healthy := int64(7); healthy >= 2; healthy-- {
		mgr.set("example.com/gpu", 8, healthy)
	}
	h.next()
	h.settle()
	require.Equal(t, 2, h.applies(), "a burst of changes is one write")
	require.Equal(t, int64(2), counts(h.node().Status.Allocatable)["example.com/gpu"])

	for range 3 {
		h.next()
	}
	require.Equal(t, 2, h.applies(), "nothing changed: nothing written before the resync")
}

func TestResyncRewritesAnUnchangedStatus(t *testing.T) {
	mgr := &fakeManager{}
	mgr.set("example.com/gpu", 1, 1)
	h := newHarness(t, mgr, nodestatus.Options{ResyncInterval: 5 * time.Second}, emptyNode())
	for range 4 {
		h.next()
	}
	require.Equal(t, 1, h.applies())
	h.next() // 5s after the first write
	h.settle()
	require.Equal(t, 2, h.applies())
}

func TestAResourceNoLongerReportedIsRemovedAndOtherWritersKeepTheirs(t *testing.T) {
	mgr := &fakeManager{}
	mgr.set("example.com/gpu", 2, 2)
	mgr.set("example.com/fpga", 1, 1)
	h := newHarness(t, mgr, nodestatus.Options{}, emptyNode())
	h.settle()

	// Another agent owns cpu, its own extended resource and a condition.
	other := corev1ac.Node(node).WithStatus(corev1ac.NodeStatus().
		WithCapacity(v1.ResourceList{v1.ResourceCPU: resource.MustParse("4"), "example.com/nic": resource.MustParse("7")}).
		WithConditions(corev1ac.NodeCondition().WithType(v1.NodeReady).WithStatus(v1.ConditionTrue)))
	_, err := h.client.CoreV1().Nodes().ApplyStatus(context.Background(), other, metav1.ApplyOptions{FieldManager: "agent", Force: true})
	require.NoError(t, err)

	mgr.drop("example.com/fpga")
	mgr.set("example.com/gpu", 2, 1)
	h.next()
	h.settle()
	n := h.node()
	require.Equal(t, map[v1.ResourceName]int64{"example.com/gpu": 2, v1.ResourceCPU: 4, "example.com/nic": 7}, counts(n.Status.Capacity))
	require.Equal(t, map[v1.ResourceName]int64{"example.com/gpu": 1}, counts(n.Status.Allocatable))
	require.Len(t, n.Status.Conditions, 1)

	mgr.drop("example.com/gpu")
	h.next()
	h.settle()
	n = h.node()
	require.Equal(t, map[v1.ResourceName]int64{v1.ResourceCPU: 4, "example.com/nic": 7}, counts(n.Status.Capacity))
	require.Empty(t, n.Status.Allocatable)
}

func TestRegisterNodeCreatesAMissingNode(t *testing.T) {
	mgr := &fakeManager{}
	mgr.set("example.com/gpu", 1, 1)
	h := newHarness(t, mgr, nodestatus.Options{RegisterNode: true})
	h.settle()
	require.Equal(t, map[v1.ResourceName]int64{"example.com/gpu": 1}, counts(h.node().Status.Capacity))
	require.Equal(t, 0, h.published("failure"))
}

func TestAMissingNodeIsRetriedWithBackoffUntilItExists(t *testing.T) {
	mgr := &fakeManager{}
	mgr.set("example.com/gpu", 1, 1)
	h := prepare(t, mgr)
	// The fake clientset applies to a missing node by creating it; the API
	// server answers NotFound for its status. Each write is recorded with
	// its round: the manager was read once in each round before it.
	var mu sync.Mutex
	missing := true
	var attempts []int
	h.client.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if missing {
			attempts = append(attempts, mgr.readCount()-1)
			return true, nil, notFound()
		}
		return false, nil, nil
	})
	h.start(nodestatus.Options{MaxBackoff: 8 * time.Second})
	recorded := func() []int {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(attempts)
	}
	for range 40 {
		h.next()
	}
	// The last round may still be failing its write: wait for its count.
	require.Eventually(t, func() bool { return h.published("failure") == len(recorded()) }, 10*time.Second, time.Millisecond)
	got := recorded()
	require.Equal(t, 0, got[0], "the first round writes")
	require.GreaterOrEqual(t, len(got), 5)
	// Each wait doubles from the poll interval up to MaxBackoff, with up
	// to 10% more: in rounds, 1 or 2, then 2 or 3, 4 or 5, then 8 or 9.
	bounds := [][2]int{{1, 2}, {2, 3}, {4, 5}, {8, 9}}
	for i := 1; i < len(got); i++ {
		b := bounds[min(i-1, len(bounds)-1)]
		gap := got[i] - got[i-1]
		require.True(t, gap >= b[0] && gap <= b[1], "gap %d after failure %d is %d rounds, want %d..%d (attempts in rounds %v)", i, i, gap, b[0], b[1], got)
	}

	mu.Lock()
	missing = false
	mu.Unlock()
	for range 10 {
		h.next()
	}
	require.Equal(t, 1, h.published("success"))
	require.Equal(t, map[v1.ResourceName]int64{"example.com/gpu": 1}, counts(h.node().Status.Capacity))
}

func notFound() error {
	return apierrors.NewNotFound(schema.GroupResource{Resource: "nodes"}, node)
}

func TestAWipedNodeHasItsUnreportedExtendedResourcesZeroedOnceThenRemoved(t *testing.T) {
	existing := emptyNode()
	existing.Status.Capacity = v1.ResourceList{v1.ResourceCPU: resource.MustParse("4"),
		"example.com/gpu": resource.MustParse("4"), "example.com/fpga": resource.MustParse("2")}
	existing.Status.Allocatable = existing.Status.Capacity.DeepCopy()
	mgr := &fakeManager{wiped: true}
	mgr.set("example.com/gpu", 1, 1)
	h := newHarness(t, mgr, nodestatus.Options{}, existing)
	h.next()
	h.settle()
	capacity, allocatable := h.applied(0)
	require.Equal(t, map[v1.ResourceName]int64{"example.com/gpu": 1, "example.com/fpga": 0}, capacity)
	require.Equal(t, map[v1.ResourceName]int64{"example.com/gpu": 1, "example.com/fpga": 0}, allocatable)
	require.Equal(t, 2, h.applies(), "the zero is applied once")
	capacity, _ = h.applied(1)
	require.Equal(t, map[v1.ResourceName]int64{"example.com/gpu": 1}, capacity)
	n := h.node()
	require.Equal(t, map[v1.ResourceName]int64{v1.ResourceCPU: 4, "example.com/gpu": 1}, counts(n.Status.Capacity))
	require.Equal(t, map[v1.ResourceName]int64{v1.ResourceCPU: 4, "example.com/gpu": 1}, counts(n.Status.Allocatable))

	mgr.set("example.com/fpga", 2, 1)
	h.next()
	h.settle()
	require.Equal(t, int64(1), counts(h.node().Status.Allocatable)["example.com/fpga"])
}

// applyAs applies capacity and allocatable to the node's status as another
// field manager, without force.
func applyAs(t *testing.T, h *harness, manager string, name v1.ResourceName, n int64) error {
	t.Helper()
	l := v1.ResourceList{name: *resource.NewQuantity(n, resource.DecimalSI)}
	ac := corev1ac.Node(node).WithStatus(corev1ac.NodeStatus().WithCapacity(l).WithAllocatable(l))
	_, err := h.client.CoreV1().Nodes().ApplyStatus(context.Background(), ac, metav1.ApplyOptions{FieldManager: manager})
	return err
}

func TestAWipeLeavesTheExtendedResourcesOfOtherFieldManagersAlone(t *testing.T) {
	mgr := &fakeManager{wiped: true}
	h := prepare(t, mgr, emptyNode())
	require.NoError(t, applyAs(t, h, "agent", "example.com/dongle", 7))
	require.NoError(t, applyAs(t, h, "kubelet", "example.com/gpu", 4))
	h.client.ClearActions()
	h.start(nodestatus.Options{})
	h.next()
	h.settle()
	capacity, _ := h.applied(0)
	require.Equal(t, map[v1.ResourceName]int64{"example.com/gpu": 0}, capacity, "the kubelet's resource is zeroed, the agent's is not")
	require.Equal(t, map[v1.ResourceName]int64{"example.com/dongle": 7}, counts(h.node().Status.Capacity),
		"the zeroed kubelet resource is removed")

	require.NoError(t, applyAs(t, h, "agent", "example.com/dongle", 8), "the agent still owns its resource alone")
	h.next()
	h.settle()
	require.Equal(t, map[v1.ResourceName]int64{"example.com/dongle": 8}, counts(h.node().Status.Capacity))
	require.Equal(t, map[v1.ResourceName]int64{"example.com/dongle": 8}, counts(h.node().Status.Allocatable))
}

func TestAResourceZeroedByAWipeIsRemovedOnceItsPluginIsGoneAgain(t *testing.T) {
	existing := emptyNode()
	existing.Status.Capacity = v1.ResourceList{"example.com/gpu": resource.MustParse("4")}
	existing.Status.Allocatable = existing.Status.Capacity.DeepCopy()
	mgr := &fakeManager{wiped: true}
	h := newHarness(t, mgr, nodestatus.Options{}, existing)
	mgr.set("example.com/gpu", 2, 2)
	h.next()
	h.settle()
	capacity, _ := h.applied(0)
	require.Equal(t, map[v1.ResourceName]int64{"example.com/gpu": 0}, capacity)
	require.Equal(t, map[v1.ResourceName]int64{"example.com/gpu": 2}, counts(h.node().Status.Capacity))

	mgr.drop("example.com/gpu") // retired after the grace period
	h.next()
	h.settle()
	require.Empty(t, h.node().Status.Capacity)
	require.Empty(t, h.node().Status.Allocatable)
}

// A resource reported and retired again before any apply went through is
// still zeroed: only an apply takes it over from its old owner, so that
// leaving it out afterwards removes it.
func TestAResourceRetiredBeforeAnyApplyAfterAWipeIsStillZeroedAndRemoved(t *testing.T) {
	existing := emptyNode()
	existing.Status.Capacity = v1.ResourceList{"example.com/gpu": resource.MustParse("4")}
	existing.Status.Allocatable = existing.Status.Capacity.DeepCopy()
	mgr := &fakeManager{wiped: true}
	h := prepare(t, mgr, existing)
	// Status writes fail until the test says so; the first one that goes
	// through is kept.
	var mu sync.Mutex
	failing := true
	var first []byte
	h.client.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if failing {
			return true, nil, apierrors.NewServiceUnavailable("down")
		}
		if first == nil {
			first = a.(k8stesting.PatchAction).GetPatch()
		}
		return false, nil, nil
	})
	h.start(nodestatus.Options{MaxBackoff: time.Second})
	mgr.set("example.com/gpu", 2, 2) // its plugin is back
	for range 3 {
		h.next()
	}
	mgr.drop("example.com/gpu") // and gone past the grace period
	mu.Lock()
	failing = false
	mu.Unlock()
	for range 3 {
		h.next()
	}
	require.GreaterOrEqual(t, h.published("success"), 1)
	var n v1.Node
	mu.Lock()
	require.NoError(t, json.Unmarshal(first, &n))
	mu.Unlock()
	require.Equal(t, map[v1.ResourceName]int64{"example.com/gpu": 0}, counts(n.Status.Capacity), "the first apply that went through")
	require.Empty(t, h.node().Status.Capacity)
	require.Empty(t, h.node().Status.Allocatable)
}

func TestANodeDeletedOrCreatedAnewIsPublishedAgainWithinACheckInterval(t *testing.T) {
	for name, tc := range map[string]struct {
		register bool
		recreate bool
	}{
		"created anew by another writer": {recreate: true},
		"deleted, registered again":      {register: true},
	} {
		t.Run(name, func(t *testing.T) {
			mgr := &fakeManager{}
			mgr.set("example.com/gpu", 2, 1)
			first := emptyNode()
			first.UID = "first"
			h := newHarness(t, mgr, nodestatus.Options{CheckInterval: 5 * time.Second, RegisterNode: tc.register}, first)
			h.settle() // 1s after the write
			require.Equal(t, 1, h.applies())

			nodes := h.client.CoreV1().Nodes()
			require.NoError(t, nodes.Delete(context.Background(), node, metav1.DeleteOptions{}))
			if tc.recreate {
				second := emptyNode()
				second.UID = "second"
				_, err := nodes.Create(context.Background(), second, metav1.CreateOptions{})
				require.NoError(t, err)
			}
			for range 3 {
				h.next()
			}
			require.Equal(t, 1, h.applies(), "the node is not read again before the check interval")

			h.next() // 5s after the write: the check
			h.settle()
			require.Equal(t, 2, h.applies())
			n := h.node()
			require.Equal(t, map[v1.ResourceName]int64{"example.com/gpu": 2}, counts(n.Status.Capacity))
			require.Equal(t, map[v1.ResourceName]int64{"example.com/gpu": 1}, counts(n.Status.Allocatable))
			require.Equal(t, 0, h.published("failure"))
		})
	}
}

func TestAStatusThatLostWhatWasAppliedIsPublishedAgainWithinACheckInterval(t *testing.T) {
	mgr := &fakeManager{}
	mgr.set("example.com/gpu", 2, 2)
	h := newHarness(t, mgr, nodestatus.Options{CheckInterval: 5 * time.Second}, emptyNode())
	h.settle()
	// Another writer overwrites the status (an update takes no ownership
	// conflict into account).
	n := h.node()
	n.Status.Capacity["example.com/gpu"] = resource.MustParse("0")
	_, err := h.client.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{FieldManager: "other"})
	require.NoError(t, err)
	for range 3 {
		h.next()
	}
	require.Equal(t, 1, h.applies())
	h.next() // 5s after the write: the check
	h.settle()
	require.Equal(t, 2, h.applies())
	require.Equal(t, map[v1.ResourceName]int64{"example.com/gpu": 2}, counts(h.node().Status.Capacity))
}

func TestApplyConfigurationHoldsExactlyTheResources(t *testing.T) {
	ac := nodestatus.ApplyConfiguration(node, map[v1.ResourceName]int64{"example.com/gpu": 3}, map[v1.ResourceName]int64{"example.com/gpu": 1})
	require.Equal(t, node, *ac.Name)
	require.Equal(t, map[v1.ResourceName]int64{"example.com/gpu": 3}, counts(*ac.Status.Capacity))
	require.Equal(t, map[v1.ResourceName]int64{"example.com/gpu": 1}, counts(*ac.Status.Allocatable))

	empty := nodestatus.ApplyConfiguration(node, nil, map[v1.ResourceName]int64{})
	require.Nil(t, empty.Status.Capacity, "no resources: the map is left out, so the manager owns none")
	require.Nil(t, empty.Status.Allocatable)
}

func TestNewRefusesIncompleteOptions(t *testing.T) {
	client := fake.NewClientset()
	mgr := &fakeManager{}
	for name, opts := range map[string]nodestatus.Options{
		"no client":        {NodeName: node, Manager: mgr},
		"no node name":     {Client: client, Manager: mgr},
		"no manager":       {Client: client, NodeName: node},
		"negative backoff": {Client: client, NodeName: node, Manager: mgr, MaxBackoff: -1},
	} {
		_, err := nodestatus.New(opts)
		require.Error(t, err, name)
	}
}

package devicemanager

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/openkubelet/devmgr/endpoint"
)

// The core's rules, driven directly: no gRPC, no lock, no clock but the
// times the tests pass in.

// newTestCore returns a core with resource res connected through a
// placeholder endpoint (its identity is all the rules use), stopped on
// clk when the test stops it.
func newTestCore(t *testing.T, l limits, clk *testingclock.FakeClock, res string) (*core, *endpoint.Endpoint) {
	t.Helper()
	c := newCore(l)
	ep := endpoint.NewStopped(res, clk)
	require.Nil(t, c.connect(res, ep.SocketPath(), ep))
	return c, ep
}

// admitInCore reserves ids for the container and records them, as an Allocate
// call whose plugin call succeeded.
func admitInCore(t *testing.T, c *core, pod, container, res string, ids ...string) effects {
	t.Helper()
	c.beginAllocate(pod)
	defer c.endCall(pod)
	rid, err := c.ledger.Reserve(pod, container, res, ids)
	require.NoError(t, err)
	got, eff, err := c.record(pod, container, []allocated{{rid: rid, resource: res, ids: ids, resp: &pluginapi.ContainerAllocateResponse{}}})
	require.NoError(t, err)
	require.Equal(t, []string{res}, got)
	return eff
}

func activePod(uid string) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid)}}
}

func TestCoreAdmissionRecordLivesFromFirstAllocateToCollection(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Unix(1000, 0))
	c, ep := newTestCore(t, limits{events: true}, clk, res1)
	_, _, _, ok := c.applyDevices(res1, ep, devices("d", 4))
	require.True(t, ok)

	// An admission that recorded nothing leaves a record only until
	// another pod's admission begins.
	c.beginAllocate("idle")
	c.endCall("idle")
	require.Contains(t, c.pods, "idle")
	c.beginAllocate("other")
	assert.NotContains(t, c.pods, "idle", "a record that holds nothing goes when another pod is admitted")
	c.endCall("other")

	// A recorded allocation changes the checkpoint and stamps the pod.
	eff := admitInCore(t, c, "p", "app", res1, "d0")
	assert.True(t, eff.write)
	assert.Equal(t, c.gen, eff.gen)
	assert.True(t, eff.settled)
	stamp := c.pods["p"].lastCommit
	require.Positive(t, stamp)

	// Another pod's admission takes p's reuse pool, not its record.
	c.beginAllocate("q")
	assert.Nil(t, c.pods["p"].reuse)
	assert.Contains(t, c.pods, "p")
	c.endCall("q")

	// A list of active pods read before p's commit does not collect it.
	gone, _ := c.collectPods(nil, stamp-1, ReleasePodInactive)
	assert.Empty(t, gone)
	// Nor while one of its Allocate calls runs.
	c.beginAllocate("p")
	gone, _ = c.collectPods(nil, stamp, ReleasePodInactive)
	assert.Empty(t, gone)
	c.endCall("p")
	// Nor while it is active.
	gone, _ = c.collectPods([]*v1.Pod{activePod("p")}, stamp, ReleasePodInactive)
	assert.Empty(t, gone)

	gone, eff = c.collectPods(nil, stamp, ReleasePodInactive)
	assert.Equal(t, []string{"p"}, gone)
	assert.Equal(t, []Event{{Kind: EventReleased, PodUID: "p", ContainerName: "app", ResourceName: res1,
		DeviceIDs: []string{"d0"}, Reason: ReleasePodInactive}}, eff.events)
	assert.False(t, eff.write, "garbage collection writes no checkpoint")
	assert.NotContains(t, c.pods, "p")
	assert.Zero(t, c.ledger.Len())
}

func TestCoreReusePoolGoesToLaterContainersOfThePod(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Unix(1000, 0))
	c, ep := newTestCore(t, limits{}, clk, res1)
	c.applyDevices(res1, ep, devices("d", 2))

	c.beginAllocate("p")
	rid, err := c.ledger.Reserve("p", "init", res1, []string{"d1"})
	require.NoError(t, err)
	_, _, err = c.record("p", "init", []allocated{{rid: rid, resource: res1, ids: []string{"d1"}, resp: &pluginapi.ContainerAllocateResponse{}}})
	require.NoError(t, err)
	c.containerAdmitted("p", "init", true)
	c.endCall("p")
	assert.Equal(t, []string{"d1"}, sets.List(c.reusable("p", res1)))

	c.beginAllocate("p")
	in, _, err := c.selection("p", "app", res1, 1, nil, false, clk.Now())
	require.NoError(t, err)
	assert.Equal(t, []string{"d1"}, in.Reusable, "the init container's device is offered first")
	c.endCall("p")
	assert.Nil(t, c.reusable("other", res1))
}

func TestCoreDeviceListsNotifyOwnersAndChangeTheCheckpoint(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Unix(1000, 0))
	c, ep := newTestCore(t, limits{}, clk, res1)

	eff, changed, healthy, ok := c.applyDevices(res1, ep, devices("d", 3))
	require.True(t, ok)
	assert.Equal(t, 3, changed)
	assert.Equal(t, 3, healthy)
	assert.True(t, eff.write, "the first list puts the resource in the checkpoint")
	assert.True(t, eff.ready, "the first list wakes admissions waiting for the plugin")
	assert.Empty(t, eff.notify, "no device is held yet")

	admitInCore(t, c, "p", "app", res1, "d1")
	eff, _, healthy, _ = c.applyDevices(res1, ep, []*pluginapi.Device{
		dev("d0", pluginapi.Healthy), dev("d1", pluginapi.Unhealthy), dev("d2", pluginapi.Healthy)})
	assert.Equal(t, 2, healthy)
	assert.Equal(t, []string{"p"}, eff.notify, "the owner of the device that turned unhealthy")
	assert.True(t, eff.write)
	assert.False(t, eff.ready)

	gen := c.gen
	eff, changed, _, _ = c.applyDevices(res1, ep, []*pluginapi.Device{
		dev("d0", pluginapi.Healthy), dev("d1", pluginapi.Unhealthy), dev("d2", pluginapi.Healthy)})
	assert.Zero(t, changed)
	assert.False(t, eff.write, "the same list again changes nothing")
	assert.Empty(t, eff.notify)
	assert.Equal(t, gen, c.gen)

	other := endpoint.NewStopped(res1, clk)
	_, _, _, ok = c.applyDevices(res1, other, devices("x", 1))
	assert.False(t, ok, "a list from an instance that is not connected is dropped")
}

func TestCoreResourceNotReadyUntilListedAndRemovedAfterTheGracePeriod(t *testing.T) {
	const grace = time.Minute
	clk := testingclock.NewFakeClock(time.Unix(1000, 0))
	c, ep := newTestCore(t, limits{grace: grace}, clk, res1)
	assert.Equal(t, "its plugin has not listed its devices yet", c.notReadyReason(res1, clk.Now()))
	_, err := c.check("p", "app", res1, 1, false, clk.Now())
	assert.ErrorIs(t, err, ErrPluginNotReady)

	c.applyDevices(res1, ep, devices("d", 1))
	assert.Empty(t, c.notReadyReason(res1, clk.Now()))

	last, _, ok := c.disconnect(res1, ep)
	require.True(t, ok)
	require.True(t, last)
	stopped := ep.StopTime()
	assert.Equal(t, "no plugin instance is connected", c.notReadyReason(res1, stopped.Add(grace)))

	capacity, allocatable, removed, eff := c.capacity(stopped.Add(grace))
	assert.Empty(t, removed, "within the grace period")
	assert.Equal(t, int64(1), capacity.Name(v1.ResourceName(res1), "").Value())
	assert.Equal(t, int64(0), allocatable.Name(v1.ResourceName(res1), "").Value(), "the devices of a plugin gone are unhealthy")
	assert.False(t, eff.write)

	_, _, removed, eff = c.capacity(stopped.Add(grace + time.Nanosecond))
	assert.Equal(t, []string{res1}, removed)
	assert.True(t, eff.write, "the resource leaves the checkpoint")
	assert.True(t, eff.ready, "admissions waiting for its plugin look again")
	assert.Empty(t, c.notReadyReason(res1, stopped.Add(grace+time.Nanosecond)))
	assert.False(t, c.isDevicePluginResource(res1))
}

func TestCoreLimitsOnResourcesAndInstances(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Unix(1000, 0))
	c, _ := newTestCore(t, limits{maxResources: 1, maxInstances: 1}, clk, res1)

	reason, err := c.admitInstance(res2, "/dp/other.sock")
	assert.Equal(t, reasonResources, reason)
	assert.ErrorIs(t, err, ErrPluginLimit)

	reason, err = c.admitInstance(res1, "/dp/second.sock")
	assert.Equal(t, reasonInstances, reason)
	assert.ErrorIs(t, err, ErrPluginLimit)

	_, err = c.admitInstance(res1, "")
	assert.NoError(t, err, "the same socket again replaces its instance")
}

package devicemanager

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/plugintest"
	"github.com/openkubelet/devmgr/podinfo"
)

var claimA = Claim{Namespace: "ns", Name: "claim-a", UID: "uid-a"}

// prepare calls PrepareClaim for request "req" of res1.
func (h *harness) prepare(claim Claim, ids ...string) (*DeviceRunContainerOptions, error) {
	return h.m.PrepareClaim(context.Background(), claim, "req", res1, ids)
}

// claimed returns the devices of res1 that request "req" of the claim holds.
func (h *harness) claimed(claim Claim) []string {
	pod := newPod(ClaimPodUID(claim.UID))
	return h.held(pod, "req", res1)
}

func TestPrepareClaimHoldsExactlyTheChosenDevices(t *testing.T) {
	h := newHarness(t).start()
	p := h.registered(res1, devices("g", 4))

	opts, err := h.prepare(claimA, "g3", "g1")
	require.NoError(t, err)
	assert.Equal(t, []string{"g1", "g3"}, h.claimed(claimA))
	calls := p.CallsOf(plugintest.MethodAllocate)
	require.Len(t, calls, 1)
	assert.Equal(t, []string{"g1", "g3"}, calls[0].Request.(*pluginapi.AllocateRequest).ContainerRequests[0].DevicesIds)
	require.NotNil(t, opts)
	assert.Equal(t, []EnvVar{{Name: "PLUGINTEST_DOMAIN1_COM_RESOURCE1", Value: "g1,g3"}}, opts.Envs)
	assert.Len(t, opts.Devices, 2)
	assert.Len(t, opts.Mounts, 2)

	// Pods get what is left, and allocatable says so.
	h.waitCapacity(res1, 4, 2)
	pod := newPod("p", ctr("c", res1, 3))
	h.pods.add(pod)
	require.ErrorIs(t, h.admit(pod), ErrInsufficientDevices)
	pod2 := newPod("p2", ctr("c", res1, 2))
	h.pods.add(pod2)
	require.NoError(t, h.admit(pod2))
	assert.Equal(t, []string{"g0", "g2"}, h.held(pod2, "c", res1))

	st := h.m.Status()[0].Devices
	assert.Equal(t, []bool{false, true, false, true}, []bool{st[0].Claimed, st[1].Claimed, st[2].Claimed, st[3].Claimed})
	assert.True(t, st[0].Allocated)
}

func TestPrepareClaimIsIdempotent(t *testing.T) {
	h := newHarness(t).start()
	p := h.registered(res1, devices("g", 3))
	first, err := h.prepare(claimA, "g0")
	require.NoError(t, err)
	again, err := h.prepare(claimA, "g0")
	require.NoError(t, err)
	assert.Equal(t, first, again)
	assert.Len(t, p.CallsOf(plugintest.MethodAllocate), 1, "the second prepare calls no plugin")

	_, err = h.prepare(claimA, "g1")
	require.ErrorIs(t, err, ErrInvalidRequest)
	assert.Contains(t, err.Error(), "holds [g0]")
	assert.Equal(t, []string{"g0"}, h.claimed(claimA))
}

func TestPrepareClaimRefusesDevicesItCannotHave(t *testing.T) {
	h := newHarness(t).start()
	h.registered(res1, []*pluginapi.Device{dev("g0", pluginapi.Healthy), dev("g1", pluginapi.Unhealthy), dev("g2", pluginapi.Healthy)})
	pod := newPod("p", ctr("c", res1, 1))
	h.pods.add(pod)
	require.NoError(t, h.admit(pod))
	require.Equal(t, []string{"g0"}, h.held(pod, "c", res1))

	for _, tc := range []struct {
		ids  []string
		want string
	}{
		{[]string{"g1"}, `device "g1" of ` + res1 + ` is unknown or unhealthy`},
		{[]string{"g2", "nope"}, `device "nope" of ` + res1 + ` is unknown or unhealthy`},
		{[]string{"g0", "g2"}, `device "g0" is held by pod "p"`},
	} {
		_, err := h.prepare(claimA, tc.ids...)
		require.ErrorIs(t, err, ErrInsufficientDevices, "%v", tc.ids)
		assert.Contains(t, err.Error(), tc.want)
		assert.Empty(t, h.claimed(claimA), "%v: nothing held", tc.ids)
	}
	_, err := h.m.PrepareClaim(context.Background(), claimA, "req", "example.com/none", []string{"x"})
	require.Error(t, err)
	_, err = h.m.PrepareClaim(context.Background(), Claim{Name: "no-uid"}, "req", res1, []string{"g2"})
	require.ErrorIs(t, err, ErrInvalidRequest)

	// And a pod cannot pass for a claim.
	fake := newPod(ClaimPodUID("x"), ctr("req", res1, 1))
	h.pods.add(fake)
	require.ErrorIs(t, h.admit(fake), ErrInvalidRequest)
}

func TestClaimsOutliveGarbageCollectionAndRestarts(t *testing.T) {
	h := newHarness(t).start()
	p := h.registered(res1, devices("g", 2))
	_, err := h.prepare(claimA, "g1")
	require.NoError(t, err)

	h.m.UpdateAllocatedDevices() // no active pod at all
	assert.Equal(t, []string{"g1"}, h.claimed(claimA))

	h.restart(nil, nil)
	assert.Equal(t, []string{"g1"}, h.claimed(claimA), "restored from the checkpoint")
	h.m.UpdateAllocatedDevices()
	assert.Equal(t, []string{"g1"}, h.claimed(claimA), "not released at start either")
	_, err = h.prepare(claimA, "g1")
	require.NoError(t, err, "prepared again after the restart")
	assert.Len(t, p.CallsOf(plugintest.MethodAllocate), 1, "without a second Allocate")
}

func TestUnprepareClaimReleasesItsDevices(t *testing.T) {
	h := newEventsHarness(t).start()
	h.registered(res1, devices("g", 2))
	_, err := h.m.PrepareClaim(context.Background(), claimA, "a", res1, []string{"g0"})
	require.NoError(t, err)
	_, err = h.m.PrepareClaim(context.Background(), claimA, "b", res1, []string{"g1"})
	require.NoError(t, err)
	uid := ClaimPodUID(claimA.UID)
	assert.ElementsMatch(t, []Event{admitted(uid, "a", res1, "g0"), admitted(uid, "b", res1, "g1")}, takeEvents(t, h.m.Events(), 2))
	h.waitCapacity(res1, 2, 0)

	require.NoError(t, h.m.UnprepareClaim(claimA.UID))
	assert.ElementsMatch(t, []Event{
		released(ReleaseClaimUnprepared, uid, "a", res1, "g0"), released(ReleaseClaimUnprepared, uid, "b", res1, "g1"),
	}, takeEvents(t, h.m.Events(), 2))
	h.waitCapacity(res1, 2, 2)
	require.NoError(t, h.m.UnprepareClaim(claimA.UID), "a claim that holds nothing")

	h.restart(nil, nil)
	assert.Empty(t, h.m.GetDevices(uid, "a"), "the checkpoint no longer holds it")
}

func TestPrepareClaimCallsPreStartAndNamesTheClaim(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.SendPodInfo = true }).start()
	p := h.registered(res1, devices("g", 2), func(o *plugintest.Options) { o.PreStartRequired = true })
	_, err := h.prepare(claimA, "g0")
	require.NoError(t, err)
	want := podinfo.Info{Kind: podinfo.KindResourceClaim, Namespace: "ns", Name: "claim-a", UID: "uid-a", Container: "req"}
	for _, m := range []plugintest.Method{plugintest.MethodAllocate, plugintest.MethodPreStartContainer} {
		calls := p.CallsOf(m)
		require.Len(t, calls, 1, "%s", m)
		got, ok := calls[0].PodInfo()
		assert.True(t, ok)
		assert.Equal(t, want, got, "%s", m)
	}
}

// A claim prepared between the containers of a pod leaves the pod its
// reuse pool: the app container takes the init container's devices.
func TestPrepareClaimKeepsAnAdmittingPodsReusePool(t *testing.T) {
	h := newHarness(t).start()
	h.registered(res1, devices("g", 3))
	pod := newPod("p", ctr("app", res1, 2))
	pod.Spec.InitContainers = []v1.Container{ctr("init", res1, 2)}
	h.pods.add(pod)
	require.NoError(t, h.m.Allocate(context.Background(), pod, &pod.Spec.InitContainers[0]))
	_, err := h.prepare(claimA, "g2")
	require.NoError(t, err)
	require.NoError(t, h.m.Allocate(context.Background(), pod, &pod.Spec.Containers[0]))
	assert.Equal(t, h.held(pod, "init", res1), h.held(pod, "app", res1))
}

// A failed PreStartContainer releases the claim: the kubelet's retry
// starts over, PreStartContainer included.
func TestPrepareClaimStartsOverAfterAFailedPreStart(t *testing.T) {
	h := newHarness(t).start()
	p := h.registered(res1, devices("g", 2), func(o *plugintest.Options) { o.PreStartRequired = true })
	p.SetError(plugintest.MethodPreStartContainer, errors.New("card busy"))
	_, err := h.prepare(claimA, "g0")
	require.ErrorContains(t, err, "card busy")
	assert.Empty(t, h.claimed(claimA), "released")
	assert.Empty(t, h.m.PreparedClaims())

	p.SetError(plugintest.MethodPreStartContainer, nil)
	_, err = h.prepare(claimA, "g0")
	require.NoError(t, err)
	assert.Len(t, p.CallsOf(plugintest.MethodPreStartContainer), 2)
	assert.Len(t, p.CallsOf(plugintest.MethodAllocate), 2)
	assert.Equal(t, []string{claimA.UID}, h.m.PreparedClaims())
}

// An unprepare whose checkpoint write failed writes it when retried: a
// restart then does not bring the claim back.
func TestUnprepareClaimWritesAgainAfterAFailedWrite(t *testing.T) {
	h := newHarness(t).start()
	h.registered(res1, devices("g", 2))
	_, err := h.prepare(claimA, "g0")
	require.NoError(t, err)
	store := h.faultyStore()
	store.set(true, false)
	require.ErrorContains(t, h.m.UnprepareClaim(claimA.UID), "checkpoint was not written")
	store.set(false, false)
	require.NoError(t, h.m.UnprepareClaim(claimA.UID))

	h.restart(nil, nil)
	assert.Empty(t, h.m.PreparedClaims())
}

// An unprepare while the claim's Allocate is in flight is refused, so that
// the allocation cannot land after it and stay forever.
func TestUnprepareClaimWaitsForAPrepareInFlight(t *testing.T) {
	h := newHarness(t).start()
	p := h.registered(res1, devices("g", 2))
	release := p.Block(plugintest.MethodAllocate)
	done := make(chan error, 1)
	go func() {
		_, err := h.prepare(claimA, "g0")
		done <- err
	}()
	_, err := p.WaitForCalls(h.waitCtx(), plugintest.MethodAllocate, 1)
	require.NoError(t, err)
	require.ErrorContains(t, h.m.UnprepareClaim(claimA.UID), "is being prepared")
	release()
	require.NoError(t, <-done)
	require.NoError(t, h.m.UnprepareClaim(claimA.UID))
	assert.Empty(t, h.m.PreparedClaims())
}

package devicemanager

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"

	"github.com/openkubelet/devmgr/plugintest"
)

// newEventsHarness is newHarness with Options.Events set. Once the test's
// managers are stopped, the last one's channel must be closed.
func newEventsHarness(t *testing.T, tune ...func(*Options)) *harness {
	var h *harness
	// Registered before newHarness's cleanups, so it runs after them.
	t.Cleanup(func() {
		if h != nil {
			drainEvents(t, h.m.Events())
		}
	})
	h = newHarness(t, append([]func(*Options){func(o *Options) { o.Events = true }}, tune...)...)
	return h
}

// nextEvent returns the next event, failing the test when none comes in
// waitTimeout or the channel is closed.
func nextEvent(t *testing.T, ch <-chan Event) Event {
	t.Helper()
	select {
	case ev, ok := <-ch:
		require.True(t, ok, "the events channel is closed")
		return ev
	case <-time.After(waitTimeout):
		t.Fatal("no event came")
		return Event{}
	}
}

// takeEvents reads n events from ch.
func takeEvents(t *testing.T, ch <-chan Event, n int) []Event {
	t.Helper()
	out := make([]Event, 0, n)
	for range n {
		out = append(out, nextEvent(t, ch))
	}
	return out
}

// drainEvents reads ch until it is closed and returns what it read.
func drainEvents(t *testing.T, ch <-chan Event) []Event {
	t.Helper()
	var out []Event
	deadline := time.After(waitTimeout)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				return out
			}
			out = append(out, ev)
		case <-deadline:
			t.Fatalf("the events channel was not closed; read %d events", len(out))
		}
	}
}

func admitted(pod, container, res string, ids ...string) Event {
	return Event{Kind: EventAdmitted, PodUID: pod, ContainerName: container, ResourceName: res, DeviceIDs: ids}
}

func released(reason ReleaseReason, pod, container, res string, ids ...string) Event {
	return Event{Kind: EventReleased, PodUID: pod, ContainerName: container, ResourceName: res, DeviceIDs: ids, Reason: reason}
}

func TestEventsNilUnlessAsked(t *testing.T) {
	h := newHarness(t).start()
	h.registered(res1, devices("d", 1))
	pod := newPod("p", ctr("c", res1, 1))
	h.pods.add(pod)
	require.NoError(t, h.admit(pod))
	assert.Nil(t, h.m.Events())
	assert.Nil(t, h.m.events, "nothing is queued")
}

// Each admitted record is reported with its devices, per container and
// resource in admission order, and each release of the pod with its reason.
func TestEventsAdmittedAndReleasedByGarbageCollection(t *testing.T) {
	collections := map[string]func(h *harness){
		"UpdateAllocatedDevices": func(h *harness) { h.m.UpdateAllocatedDevices() },
		"before an admission": func(h *harness) {
			next := newPod("next", ctr("c", res2, 1))
			h.pods.add(next)
			require.NoError(h.t, h.admit(next))
		},
		"before hints": func(h *harness) {
			next := newPod("next", ctr("c", res1, 1))
			h.m.GetTopologyHints(next, &next.Spec.Containers[0])
		},
	}
	for name, collect := range collections {
		t.Run(name, func(t *testing.T) {
			h := newEventsHarness(t).start()
			h.registered(res1, devices("a", 4))
			h.registered(res2, devices("b", 4))
			pod := newPod("p", ctr("app", res1, 1, res2, 2))
			pod.Spec.InitContainers = []v1.Container{ctr("init", res1, 2)}
			h.pods.add(pod)
			require.NoError(t, h.admit(pod))
			ch := h.m.Events()
			initIDs, appIDs, appIDs2 := h.held(pod, "init", res1), h.held(pod, "app", res1), h.held(pod, "app", res2)
			assert.Equal(t, admitted("p", "init", res1, initIDs...), nextEvent(t, ch))
			assert.Equal(t, admitted("p", "app", res1, appIDs...), nextEvent(t, ch))
			assert.Equal(t, admitted("p", "app", res2, appIDs2...), nextEvent(t, ch))

			h.pods.remove(pod.UID)
			collect(h)
			assert.Equal(t, released(ReleasePodInactive, "p", "init", res1, initIDs...), nextEvent(t, ch))
			assert.Equal(t, released(ReleasePodInactive, "p", "app", res1, appIDs...), nextEvent(t, ch))
			assert.Equal(t, released(ReleasePodInactive, "p", "app", res2, appIDs2...), nextEvent(t, ch))
			assert.Empty(t, h.m.GetDevices("p", "app"))
		})
	}
}

// Start, given the active pods, releases what the checkpoint holds for the
// others, with a reason of its own; a manager whose sources become ready
// later releases them as garbage collection does.
func TestEventsReleasedAtStart(t *testing.T) {
	h := newEventsHarness(t).start()
	h.registered(res1, devices("d", 4))
	kept, gone := newPod("kept", ctr("c", res1, 1)), newPod("gone", ctr("c", res1, 2))
	h.pods.add(kept, gone)
	require.NoError(t, h.admit(kept))
	require.NoError(t, h.admit(gone))
	goneIDs := h.held(gone, "c", res1)
	h.pods.remove(gone.UID)
	assert.Len(t, takeEvents(t, h.m.Events(), 2), 2, "two admissions")
	require.NoError(t, h.m.Stop())

	h.m = h.newManager()
	require.NoError(t, h.m.Start(h.pods.get, h.ready, nil, nil))
	assert.Equal(t, released(ReleasePodInactiveAtStart, "gone", "c", res1, goneIDs...), nextEvent(t, h.m.Events()))
	require.NoError(t, h.m.Stop())
	assert.Empty(t, drainEvents(t, h.m.Events()), "nothing else")

	notReady := &readyFlag{}
	h.m = h.newManager()
	require.NoError(t, h.m.Start(h.pods.get, notReady, nil, nil))
	notReady.set(true)
	h.m.UpdateAllocatedDevices()
	assert.Equal(t, released(ReleasePodInactive, "gone", "c", res1, goneIDs...), nextEvent(t, h.m.Events()))
}

// An admission undone because its checkpoint write failed reports nothing,
// neither when it fails nor when its pod goes.
func TestEventsNoneForAnAdmissionUndoneByAFailedWrite(t *testing.T) {
	h := newEventsHarness(t).start()
	h.registered(res1, devices("d", 2))
	store := h.faultyStore()
	failed := newPod("failed", ctr("c", res1, 1))
	h.pods.add(failed)
	store.set(true, false)
	require.ErrorIs(t, h.admit(failed), ErrCheckpoint)
	store.set(false, false)
	h.pods.remove(failed.UID)
	h.m.UpdateAllocatedDevices()

	marker := newPod("marker", ctr("c", res1, 1))
	h.pods.add(marker)
	require.NoError(t, h.admit(marker))
	assert.Equal(t, admitted("marker", "c", res1, h.held(marker, "c", res1)...), nextEvent(t, h.m.Events()),
		"the first event is the next admission")
}

// A resource removed after its grace period releases nothing: its pods
// keep their devices, reported released when the pods go.
func TestEventsNoneWhenAResourceIsRemoved(t *testing.T) {
	h := newEventsHarness(t).start()
	p := h.registered(res1, devices("d", 2))
	h.registered(res2, devices("e", 2))
	pod := newPod("p", ctr("c", res1, 1))
	h.pods.add(pod)
	require.NoError(t, h.admit(pod))
	ids := h.held(pod, "c", res1)
	ch := h.m.Events()
	require.Equal(t, admitted("p", "c", res1, ids...), nextEvent(t, ch))

	p.CloseStreams()
	h.waitCapacity(res1, 2, 0)
	h.clock.Step(DefaultStopGracePeriod + time.Second)
	_, _, removed := h.m.GetCapacity()
	require.Equal(t, []string{res1}, removed)
	assert.Equal(t, ids, h.held(pod, "c", res1), "the pod keeps its devices")

	marker := newPod("marker", ctr("c", res2, 1))
	h.pods.add(marker)
	require.NoError(t, h.admit(marker))
	assert.Equal(t, admitted("marker", "c", res2, h.held(marker, "c", res2)...), nextEvent(t, ch),
		"the removal reported nothing")
	h.pods.remove(pod.UID)
	h.m.UpdateAllocatedDevices()
	assert.Equal(t, released(ReleasePodInactive, "p", "c", res1, ids...), nextEvent(t, ch))
}

// Two Allocate calls for the same container in flight at once: the
// container ends up with one record, reported admitted once, and released
// once with the same devices.
func TestEventsOneAdmissionForConcurrentAllocateOfOneContainer(t *testing.T) {
	h := newEventsHarness(t).start()
	p := h.registered(res1, devices("d", 4))
	pod := newPod("twice", ctr("c", res1, 2))
	h.pods.add(pod)

	release := p.Block(plugintest.MethodAllocate)
	defer release()
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- h.m.Allocate(context.Background(), pod, &pod.Spec.Containers[0]) }()
	}
	_, err := p.WaitForCalls(waitCtx(t), plugintest.MethodAllocate, 2)
	require.NoError(t, err)
	release()
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
	ids := h.held(pod, "c", res1)
	require.Len(t, ids, 2)

	h.pods.remove(pod.UID)
	h.m.UpdateAllocatedDevices()
	marker := newPod("marker", ctr("c", res1, 1))
	h.pods.add(marker)
	require.NoError(t, h.admit(marker))
	assert.Equal(t, []Event{
		admitted("twice", "c", res1, ids...),
		released(ReleasePodInactive, "twice", "c", res1, ids...),
		admitted("marker", "c", res1, h.held(marker, "c", res1)...),
	}, takeEvents(t, h.m.Events(), 3), "one admission of the container, then the marker's")
}

// Many pods admitted and released by concurrent workers, read by a reader
// of its own: every record is admitted once, with the devices the container
// got, then released once with the same devices, and replaying the events
// never gives a device to two containers at once.
func TestEventsInOrderAndCompleteUnderConcurrency(t *testing.T) {
	const workers, rounds = 6, 15
	h := newEventsHarness(t).start()
	// Enough for two pods per worker: its own, and its previous one until
	// a collection drops it.
	h.registered(res1, devices("a", 4*workers))
	h.registered(res2, devices("b", 2*workers))

	var got []Event
	read := make(chan struct{})
	go func() {
		defer close(read)
		for ev := range h.m.Events() {
			got = append(got, ev)
		}
	}()

	type key struct{ pod, container, res string }
	var mu sync.Mutex
	held := map[key][]string{}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for r := range rounds {
				pod := newPod(fmt.Sprintf("w%d-%d", w, r), ctr("c0", res1, 1, res2, 1), ctr("c1", res1, 1))
				h.pods.add(pod)
				if err := h.admit(pod); err != nil {
					t.Errorf("admit %s: %v", pod.UID, err)
					return
				}
				mu.Lock()
				for _, k := range []key{{string(pod.UID), "c0", res1}, {string(pod.UID), "c0", res2}, {string(pod.UID), "c1", res1}} {
					held[k] = h.held(pod, k.container, k.res)
				}
				mu.Unlock()
				h.pods.remove(pod.UID)
				switch r % 3 {
				case 0:
					h.m.UpdateAllocatedDevices()
				case 1:
					h.m.GetTopologyHints(pod, &pod.Spec.Containers[1])
				} // else: collected before another worker's admission
			}
		})
	}
	wg.Wait()
	h.m.UpdateAllocatedDevices()
	require.NoError(t, h.m.Stop())
	select {
	case <-read:
	case <-time.After(waitTimeout):
		t.Fatal("the events channel was not closed")
	}
	// Stop may close the channel before the reader has had everything.
	got = append(got, h.m.UndeliveredEvents()...)

	require.Len(t, held, workers*rounds*3)
	require.Len(t, got, 2*len(held))
	admittedOnce := map[key]bool{}
	releasedOnce := map[key]bool{}
	holder := map[string]key{} // resource/device -> its holder
	for i, ev := range got {
		k := key{ev.PodUID, ev.ContainerName, ev.ResourceName}
		require.Equal(t, held[k], ev.DeviceIDs, "event %d: %+v", i, ev)
		switch ev.Kind {
		case EventAdmitted:
			require.False(t, admittedOnce[k], "event %d: admitted twice: %+v", i, ev)
			admittedOnce[k] = true
			for _, id := range ev.DeviceIDs {
				other, busy := holder[ev.ResourceName+"/"+id]
				require.False(t, busy, "event %d: %s/%s admitted to %v while %v holds it", i, ev.ResourceName, id, k, other)
				holder[ev.ResourceName+"/"+id] = k
			}
		case EventReleased:
			require.True(t, admittedOnce[k], "event %d: released before admitted: %+v", i, ev)
			require.False(t, releasedOnce[k], "event %d: released twice: %+v", i, ev)
			require.Equal(t, ReleasePodInactive, ev.Reason)
			releasedOnce[k] = true
			for _, id := range ev.DeviceIDs {
				delete(holder, ev.ResourceName+"/"+id)
			}
		default:
			t.Fatalf("event %d: unknown kind %q", i, ev.Kind)
		}
	}
	assert.Len(t, releasedOnce, len(held), "every admitted record is released")
	assert.Empty(t, holder)
}

// A reader that reads nothing for a while neither slows the manager down nor
// loses an event: everything is delivered, in order, once it reads.
func TestEventsNoneDroppedWithASlowReader(t *testing.T) {
	const pods = 150
	h := newEventsHarness(t).start()
	h.registered(res1, devices("d", 1))

	var want []Event
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range pods {
			pod := newPod(fmt.Sprintf("p%03d", i), ctr("c", res1, 1))
			h.pods.add(pod)
			// Admitting it collects the previous pod, which frees the
			// only device.
			if err := h.admit(pod); err != nil {
				t.Errorf("admit %s: %v", pod.UID, err)
				return
			}
			if i > 0 {
				want = append(want, released(ReleasePodInactive, fmt.Sprintf("p%03d", i-1), "c", res1, "d0"))
			}
			want = append(want, admitted(string(pod.UID), "c", res1, "d0"))
			h.pods.remove(pod.UID)
		}
	}()
	select {
	case <-done:
	case <-time.After(waitTimeout):
		t.Fatal("admissions were held up by a reader that does not read")
	}
	assert.Equal(t, want, takeEvents(t, h.m.Events(), len(want)))
}

// Stop does not wait for the reader: it closes the channel, keeping what
// was not received for UndeliveredEvents, and the goroutine that fed it
// ends. Changes after Stop are not reported.
func TestEventsChannelClosesAfterStop(t *testing.T) {
	t.Run("nothing queued", func(t *testing.T) {
		leaks := newLeakCheck(t)
		h := newEventsHarness(t).start()
		require.NoError(t, h.m.Stop())
		assert.Empty(t, drainEvents(t, h.m.Events()))
		assert.Empty(t, h.m.UndeliveredEvents())
		leaks.verify()
	})
	t.Run("events queued for a reader that does not read", func(t *testing.T) {
		leaks := newLeakCheck(t)
		h := newEventsHarness(t).start()
		p := h.registered(res1, devices("d", 3))
		var pods []*v1.Pod
		for i := range 3 {
			pod := newPod(fmt.Sprintf("p%d", i), ctr("c", res1, 1))
			h.pods.add(pod)
			require.NoError(t, h.admit(pod))
			pods = append(pods, pod)
		}
		assert.Equal(t, admitted("p0", "c", res1, h.held(pods[0], "c", res1)...), nextEvent(t, h.m.Events()),
			"the first is delivered; two wait")
		want := []Event{
			admitted("p1", "c", res1, h.held(pods[1], "c", res1)...),
			admitted("p2", "c", res1, h.held(pods[2], "c", res1)...),
		}
		assert.Nil(t, h.m.UndeliveredEvents(), "nothing is undelivered before Stop")
		stopped := make(chan error, 1)
		go func() { stopped <- h.m.Stop() }()
		select {
		case err := <-stopped:
			require.NoError(t, err)
		case <-time.After(waitTimeout):
			t.Fatal("Stop waited for the reader")
		}
		for _, p := range pods {
			h.pods.remove(p.UID)
		}
		h.m.UpdateAllocatedDevices() // after Stop: not reported
		assert.Empty(t, h.m.GetDevices("p0", "c"))
		assert.Empty(t, drainEvents(t, h.m.Events()), "the channel is closed")
		assert.Equal(t, want, h.m.UndeliveredEvents(), "what waited, in order")
		assert.Equal(t, want, h.m.UndeliveredEvents(), "again")
		p.Stop()
		leaks.verify()
	})
}

// A reader that reads while Stop runs gets a prefix of the events, and
// UndeliveredEvents the rest: none is lost, none is in both.
func TestEventsDeliveredOrUndeliveredAcrossStop(t *testing.T) {
	const pods = 50
	leaks := newLeakCheck(t)
	h := newEventsHarness(t).start()
	p := h.registered(res1, devices("d", 1))
	var want []Event
	for i := range pods {
		pod := newPod(fmt.Sprintf("p%02d", i), ctr("c", res1, 1))
		h.pods.add(pod)
		require.NoError(t, h.admit(pod)) // collects the previous pod
		if i > 0 {
			want = append(want, released(ReleasePodInactive, fmt.Sprintf("p%02d", i-1), "c", res1, "d0"))
		}
		want = append(want, admitted(string(pod.UID), "c", res1, "d0"))
		h.pods.remove(pod.UID)
	}
	read := make(chan []Event, 1)
	ch := h.m.Events()
	go func() { read <- drainEvents(t, ch) }()
	require.NoError(t, h.m.Stop())
	delivered := <-read
	assert.Equal(t, want, append(delivered, h.m.UndeliveredEvents()...))
	p.Stop()
	leaks.verify()
}

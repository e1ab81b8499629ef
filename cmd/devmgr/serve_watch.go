package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/devicemanager"
)

// watchedManager is what the watcher needs of the manager.
type watchedManager interface {
	Status() []devicemanager.ResourceStatus
	GetCapacity() (capacity, allocatable v1.ResourceList, removed []string)
	Updates() <-chan devicemanager.ResourceUpdate
}

// watcher polls the manager and logs what changed since the last poll:
// plugin registrations and disconnections, device lists and health, and
// capacity. Its GetCapacity calls also retire resources whose plugin has
// been gone longer than the grace period, as the kubelet's node status loop
// does. The manager logs registrations and disconnections itself at V(2),
// with the same details: the watcher logs them only below that verbosity,
// so that each shows once. Device changes it logs at every verbosity: it
// names the devices, where the manager's V(2) line counts them.
//
// A plugin that registers again on the same socket between two polls, with
// the same devices, is not noticed (the manager logs it at V(2)).
type watcher struct {
	mgr watchedManager
	log klog.Logger

	// Only run's goroutine uses the fields below.
	prev        map[string]devicemanager.ResourceStatus
	capacity    v1.ResourceList
	allocatable v1.ResourceList
}

// run polls every interval, and whenever devices of admitted pods change
// health, until ctx ends.
func (w *watcher) run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	updates := w.mgr.Updates()
	w.poll()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.poll()
		case u, ok := <-updates:
			if !ok { // the manager stopped
				updates = nil
				continue
			}
			w.log.Info("Devices of admitted pods changed health", "podUIDs", u.PodUIDs)
			w.poll()
		}
	}
}

func (w *watcher) poll() {
	capacity, allocatable, removed := w.mgr.GetCapacity()
	for _, name := range removed {
		w.log.Info("Removed resource: its device plugin has been gone longer than the grace period", "resourceName", name)
	}
	cur := map[string]devicemanager.ResourceStatus{}
	for _, r := range w.mgr.Status() {
		cur[r.Name] = r
	}
	for _, name := range sets.List(sets.KeySet(cur)) {
		old, known := w.prev[name]
		w.logResource(old, known, cur[name])
	}
	names := sets.KeySet(capacity).Union(sets.KeySet(w.capacity))
	for _, name := range sets.List(names) {
		c, a := capacity[name], allocatable[name]
		oc, oa := w.capacity[name], w.allocatable[name]
		if c.Cmp(oc) != 0 || a.Cmp(oa) != 0 {
			w.log.Info("Capacity changed", "resourceName", string(name),
				"capacity", c.Value(), "allocatable", a.Value())
		}
	}
	w.prev, w.capacity, w.allocatable = cur, capacity, allocatable
}

// logResource logs how r changed since old (known: old was seen).
func (w *watcher) logResource(old devicemanager.ResourceStatus, known bool, r devicemanager.ResourceStatus) {
	log := w.log.WithValues("resourceName", r.Name)
	if !known && r.RestoredFromCheckpoint {
		log.Info("Resource restored from checkpoint; waiting for its device plugin", "allocated", r.Allocated)
	}
	if !w.log.V(2).Enabled() { // else the manager logs them
		logEndpoints(log, old.Endpoints, r.Endpoints)
	}

	before := map[string]string{}
	for _, d := range old.Devices {
		before[d.ID] = d.Health
	}
	var added, gone, healthy, unhealthy []string
	for _, d := range r.Devices {
		h, ok := before[d.ID]
		switch {
		case !ok:
			added = append(added, d.ID)
		case h != d.Health && d.Health == pluginapi.Healthy:
			healthy = append(healthy, d.ID)
		case h != d.Health:
			unhealthy = append(unhealthy, d.ID)
		}
		delete(before, d.ID)
	}
	for id := range before {
		gone = append(gone, id)
	}
	slices.Sort(gone)
	if len(added)+len(gone)+len(healthy)+len(unhealthy) == 0 {
		return
	}
	kv := []any{"devices", len(r.Devices), "healthy", r.Allocatable}
	for _, change := range []struct {
		key string
		ids []string
	}{{"added", added}, {"removed", gone}, {"nowHealthy", healthy}, {"nowUnhealthy", unhealthy}} {
		if len(change.ids) > 0 {
			kv = append(kv, change.key, brief(change.ids))
		}
	}
	log.Info("Devices updated", kv...)
}

// logEndpoints logs the plugins that registered or disconnected between the
// endpoints before and now.
func logEndpoints(log klog.Logger, before, now []devicemanager.EndpointStatus) {
	wasRunning := map[string]bool{}
	for _, e := range before {
		wasRunning[e.Socket] = !e.Stopped
	}
	for _, e := range now {
		switch {
		case !e.Stopped && !wasRunning[e.Socket]:
			log.Info("Device plugin registered", "socketPath", e.Socket,
				"preStartRequired", e.PreStartRequired, "getPreferredAllocationAvailable", e.GetPreferredAllocationAvailable)
		case e.Stopped && wasRunning[e.Socket]:
			log.Info("Device plugin disconnected; its devices are unhealthy until it registers again", "socketPath", e.Socket)
		}
		delete(wasRunning, e.Socket)
	}
	for socket, running := range wasRunning {
		if running {
			log.Info("Device plugin disconnected", "socketPath", socket)
		}
	}
}

// briefLimit is the most device IDs a log entry lists.
const briefLimit = 16

// brief returns ids, shortened for a log entry.
func brief(ids []string) []string {
	if len(ids) <= briefLimit {
		return ids
	}
	return append(slices.Clip(ids[:briefLimit]), fmt.Sprintf("... %d more", len(ids)-briefLimit))
}

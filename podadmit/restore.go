package podadmit

import (
	"context"
	"errors"
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// AdmittedPods returns copies of the admitted pods, in admission order, with
// the UID and namespace Admit gave them: what a process saves to hand to
// Restore after it restarts. Pods still being admitted are left out.
func (adm *Admitter) AdmittedPods() []*v1.Pod {
	adm.mu.Lock()
	defer adm.mu.Unlock()
	out := make([]*v1.Pod, 0, len(adm.order))
	for _, uid := range adm.order {
		out = append(out, adm.pods[uid].pod.DeepCopy())
	}
	return out
}

// AdmittedPod returns a copy of one admitted pod, as AdmittedPods gives it.
func (adm *Admitter) AdmittedPod(uid types.UID) (*v1.Pod, bool) {
	adm.mu.Lock()
	defer adm.mu.Unlock()
	e, ok := adm.pods[string(uid)]
	if !ok {
		return nil, false
	}
	return e.pod.DeepCopy(), true
}

// Restore takes back pods admitted before a restart (as AdmittedPods gave
// them) without allocating anything: their devices are whatever the manager
// restored from its checkpoint. Every pod is active, for the manager's garbage
// collection, before Restore first calls the manager; then each pod's answer
// is rebuilt from GetDeviceRunContainerOptions and GetDevices, so that Pods,
// Pod and a repeated Admit give it as before the restart.
//
// Pods without a UID, invalid pods and pods already known are skipped. A
// container whose run options cannot be had (say its resource lost its
// record and its plugin is not back to allocate again) keeps the devices it
// holds, without run options: its pod stays admitted, so that nothing it
// holds is handed to another pod, until it is released. Restore waits for
// an admission in progress to end; if ctx ends first, the pods are taken back
// with their devices and no run options. The errors of all the pods are
// joined.
func (adm *Admitter) Restore(ctx context.Context, pods []*v1.Pod) error {
	var errs []error
	var todo []*v1.Pod
	adm.mu.Lock()
	for _, p := range pods {
		if err := validate(p); err != nil {
			errs = append(errs, fmt.Errorf("restore pod: %w", err))
			continue
		}
		uid := string(p.UID)
		if uid == "" {
			errs = append(errs, fmt.Errorf("restore pod %q: %w: no UID", p.Name, ErrInvalidPod))
			continue
		}
		if _, known := adm.pods[uid]; known {
			continue
		}
		if _, known := adm.admitting[uid]; known {
			continue
		}
		p = p.DeepCopy()
		if p.Namespace == "" {
			p.Namespace = "default"
		}
		adm.admitting[uid] = p
		todo = append(todo, p)
	}
	adm.mu.Unlock()

	// Run options may allocate a record the manager lost, so they wait for
	// the admission in progress like any admission. Without a turn, the pods
	// are taken back with their devices only.
	turnErr := adm.waitTurn(ctx)
	if turnErr == nil {
		defer adm.endTurn()
	} else if len(todo) > 0 {
		errs = append(errs, fmt.Errorf("restore pods without run options: waited for an admission: %w", turnErr))
	}
	for _, p := range todo {
		a := Admission{UID: p.UID, Name: p.Name, Namespace: p.Namespace}
		for _, c := range containersOf(p) {
			if turnErr != nil {
				a.Containers = append(a.Containers, Container{Name: c.Name, Devices: devicesOf(adm.mgr, p, c)})
				continue
			}
			got, err := describe(ctx, adm.mgr, p, c)
			if err != nil {
				errs = append(errs, fmt.Errorf("restore pod %s: %w", p.UID, err))
			}
			a.Containers = append(a.Containers, got)
		}
		adm.mu.Lock()
		delete(adm.admitting, string(p.UID))
		adm.pods[string(p.UID)] = &entry{pod: p, admission: a}
		adm.order = append(adm.order, string(p.UID))
		adm.mu.Unlock()
	}
	return errors.Join(errs...)
}

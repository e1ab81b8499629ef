package devicemanager

import (
	"context"
	"errors"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/openkubelet/devmgr/podstate"
)

// A resource is not ready (ErrPluginNotReady) when the manager knows it but
// no plugin can serve it yet: its plugin is gone within the grace period
// (after a restart, the resources the checkpoint names start so), or an
// instance is connected but has not sent its first device list. Admission
// refuses such a resource at once, or waits for it up to
// Options.PluginWaitTimeout.

// notReadyReason returns why resource name is not ready at now, or "" when
// it is ready or not known at all (never registered, or removed once its
// grace period was over).
func (c *core) notReadyReason(name string, now time.Time) string {
	r := c.resources[name]
	switch {
	case r == nil || r.ready():
		return ""
	case len(r.instances) > 0:
		return "its plugin has not listed its devices yet"
	case r.registered && r.primary != nil && !c.graceOver(r.primary, now):
		return "no plugin instance is connected"
	}
	return ""
}

// notReady turns err, the refusal of a resource that cannot serve a request
// at all, into an ErrPluginNotReady error when the resource is not ready;
// any other error is returned as is.
func (c *core) notReady(name string, err error, now time.Time) error {
	var re *podstate.ResourceError
	if !errors.As(err, &re) {
		return err
	}
	if why := c.notReadyReason(name, now); why != "" {
		return &admissionError{msg: err.Error() + ": device plugin not ready (" + why + ")", sentinel: ErrPluginNotReady}
	}
	return err
}

// WaitForPlugins waits, as Allocate does before it allocates, up to
// Options.PluginWaitTimeout, until the plugins of container's resources can
// serve it: none is refused for ErrPluginNotReady, nor for having no healthy
// device while its plugin lists none at all. It allocates nothing. It
// returns nil once that holds, or at once when Options.PluginWaitTimeout is
// zero; when the wait ends before, the refusal Allocate would return then
// (wrapping ErrPluginNotReady, and the context's error when ctx ended, or
// ErrNoHealthyDevices); ErrStopped when the manager stops.
//
// A caller that admits pods one at a time calls it for each container before
// it takes its turn, so that a pod whose plugin is not back does not hold up
// the admission of other pods: its Allocate then finds the plugins ready.
func (m *ManagerImpl) WaitForPlugins(ctx context.Context, pod *v1.Pod, container *v1.Container) error {
	if err := checkRequest(pod, container); err != nil {
		return err
	}
	m.mu.Lock()
	stopped := m.state == stopped
	m.mu.Unlock()
	if stopped {
		return ErrStopped
	}
	refusal, err := m.awaitPlugins(ctx, m.containerLogger(ctx, pod, container), string(pod.UID), container,
		pluginResourceNames(pod, container))
	if err != nil {
		return err
	}
	return refusal
}

// awaitPlugins waits, up to Options.PluginWaitTimeout, until none of the
// named resources of container is refused for ErrPluginNotReady, nor for
// having no healthy device while its plugin lists none at all (some plugins
// send an empty list before their devices). It returns nil, nil once that
// holds. When the time is up, or ctx ends while only an empty list holds it,
// refusal is the refusal of the resource still waited for (the admission
// then refuses as it would have at once). err wraps ErrPluginNotReady and
// the context's error when ctx ends while a resource is not ready, and is
// ErrStopped when the manager stops. m.mu is not held while it waits.
func (m *ManagerImpl) awaitPlugins(ctx context.Context, log klog.Logger, podUID string, container *v1.Container, names []string) (refusal, err error) {
	if m.opts.PluginWaitTimeout <= 0 {
		return nil, nil
	}
	var timer clock.Timer
	for {
		m.mu.Lock()
		var notReady error
		var waitFor string
		// graceEnds is when the resource waited for stops being "not
		// ready" without any change a plugin makes: its grace period ends.
		var graceEnds time.Time
		now := m.opts.Clock.Now()
		for _, name := range names {
			q := container.Resources.Limits[v1.ResourceName(name)]
			_, err := m.core.check(podUID, container.Name, name, int(q.Value()), m.podSource.alreadyRunning(podUID, container.Name), now)
			if errors.Is(err, ErrPluginNotReady) {
				notReady, refusal, waitFor = err, err, name
				if r := m.core.resources[name]; len(r.instances) == 0 && r.primary != nil {
					graceEnds = r.primary.StopTime().Add(m.opts.StopGracePeriod)
				}
				break
			}
			if waitFor == "" && errors.Is(err, ErrNoHealthyDevices) && m.core.resources[name].listsNothing() {
				refusal, waitFor = err, name
			}
		}
		changed := m.readyChanged.wait()
		m.mu.Unlock()
		if waitFor == "" {
			return nil, nil
		}
		if timer == nil {
			timer = m.opts.Clock.NewTimer(m.opts.PluginWaitTimeout)
			defer timer.Stop()
		}
		var graceOver <-chan time.Time
		if !graceEnds.IsZero() {
			grace := m.opts.Clock.NewTimer(max(graceEnds.Sub(m.opts.Clock.Now()), 0))
			graceOver = grace.C()
			defer grace.Stop() // one per change of readiness, at most
		}
		log.V(3).Info("Waiting for a device plugin", keyResource, waitFor, keyDuration, m.opts.PluginWaitTimeout)
		select {
		case <-changed:
		case <-graceOver: // no longer "not ready": the admission refuses as it would at once
		case <-timer.C():
			return refusal, nil
		case <-ctx.Done():
			if notReady == nil {
				return refusal, nil // the plugins have spoken: the admission refuses as they say
			}
			return nil, &admissionError{msg: notReady.Error() + ": " + ctx.Err().Error(), sentinel: ErrPluginNotReady, cause: ctx.Err()}
		case <-m.ctx.Done():
			return nil, ErrStopped
		}
	}
}

package devicemanager

import (
	"errors"

	"github.com/openkubelet/devmgr/podstate"
)

// A resource is not ready (ErrPluginNotReady) when the manager knows it but
// no plugin can serve it yet: its plugin is gone within the grace period
// (after a restart, the resources the checkpoint names start so), or an
// instance is connected but has not sent its first device list. Admission
// refuses such a resource with ErrPluginNotReady.

// notReadyReasonLocked returns why resource name is not ready, or "" when
// it is ready or not known at all (never registered, or removed once its
// grace period was over). Expects m.mu held.
func (m *ManagerImpl) notReadyReasonLocked(name string) string {
	r := m.resources[name]
	switch {
	case r == nil || r.ready():
		return ""
	case len(r.instances) > 0:
		return "its plugin has not listed its devices yet"
	case r.registered && r.primary != nil && !r.primary.GracePeriodExpired(m.opts.StopGracePeriod):
		return "no plugin instance is connected"
	}
	return ""
}

// notReadyLocked turns err, the refusal of a resource that cannot serve a
// request at all, into an ErrPluginNotReady error when the resource is not
// ready; any other error is returned as is. Expects m.mu held.
func (m *ManagerImpl) notReadyLocked(name string, err error) error {
	var re *podstate.ResourceError
	if !errors.As(err, &re) {
		return err
	}
	if why := m.notReadyReasonLocked(name); why != "" {
		return &admissionError{msg: err.Error() + ": device plugin not ready (" + why + ")", sentinel: ErrPluginNotReady}
	}
	return err
}

package devicemanager

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/openkubelet/devmgr/endpoint"
	"github.com/openkubelet/devmgr/podinfo"
)

// Devices held for DRA ResourceClaims (package dra) rather than for pods.
// A claim is recorded as a pod whose UID is ClaimPodUID(claim UID), with one
// container per request of the claim: the ledger keeps its devices from
// device-plugin pods, and the checkpoint keeps them across restarts. Garbage
// collection leaves such records alone; UnprepareClaim releases them.

// claimUIDPrefix starts the UID of the pod that stands for a claim. A
// Kubernetes UID never holds a slash, and Allocate refuses pods whose UID
// starts with it.
const claimUIDPrefix = "resourceclaim/"

// ClaimPodUID is the pod UID under which the manager records the devices of
// the ResourceClaim with the given UID: in GetDevices, the Events and the
// checkpoint.
func ClaimPodUID(claimUID string) string { return claimUIDPrefix + claimUID }

// isClaim reports whether podUID stands for a claim.
func isClaim(podUID string) bool { return strings.HasPrefix(podUID, claimUIDPrefix) }

// Claim names a ResourceClaim.
type Claim struct {
	Namespace, Name, UID string
}

// ReleaseClaimUnprepared means UnprepareClaim released the claim's devices.
const ReleaseClaimUnprepared ReleaseReason = "ClaimUnprepared"

// PrepareClaim gives exactly the devices ids of resource to request of
// claim (the scheduler chose them): it reserves them, calls the plugin's
// Allocate (with the claim in the metadata when Options.SendPodInfo is set)
// and, when the plugin asks for it, PreStartContainer, writes the
// checkpoint, and returns what the plugin's answer asks of the runtime.
//
// It is idempotent: when the request already holds these devices it calls
// no plugin and returns what was recorded; when it holds others it fails.
// A device that is unknown, unhealthy or held by anyone else fails the call
// and nothing is held. When PreStartContainer fails, the whole claim is
// released, so that a retry starts over. The devices stay the claim's until
// UnprepareClaim, across restarts.
func (m *ManagerImpl) PrepareClaim(ctx context.Context, claim Claim, request, resource string, ids []string) (*DeviceRunContainerOptions, error) {
	if claim.UID == "" || request == "" || len(ids) == 0 {
		return nil, &admissionError{msg: "a claim needs a UID, a request and devices", sentinel: ErrInvalidRequest}
	}
	podUID := ClaimPodUID(claim.UID)
	m.mu.Lock()
	if m.state == stopped {
		m.mu.Unlock()
		return nil, ErrStopped
	}
	// Not beginAllocate: a claim has no reuse pool, and must not take a
	// pod's while the pod's containers are being admitted.
	m.core.beginCall(podUID)
	held := m.core.ledger.ContainerDevices(podUID, request, resource)
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		m.core.endCall(podUID)
		m.mu.Unlock()
	}()

	want := sets.New(ids...)
	if held == nil {
		if m.opts.SendPodInfo {
			ctx = podinfo.NewOutgoingContext(ctx, podinfo.Info{
				Kind: podinfo.KindResourceClaim, Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID, Container: request,
			})
		}
		a, err := m.allocateExact(ctx, podUID, request, resource, sets.List(want))
		if err != nil {
			return nil, err
		}
		if err := m.commit(podUID, request, []allocated{*a}); err != nil {
			return nil, err
		}
		m.mu.Lock()
		held = m.core.ledger.ContainerDevices(podUID, request, resource) // a concurrent call may have recorded first
		m.mu.Unlock()
		if held.Equal(want) {
			if err := m.preStartIfNeeded(ctx, podUID, request, resource); err != nil {
				return nil, errors.Join(err, m.dropClaim(podUID, true))
			}
		}
	}
	if !held.Equal(want) {
		return nil, &admissionError{
			msg: fmt.Sprintf("claim %s/%s request %s holds %v of %s, not %v",
				claim.Namespace, claim.Name, request, sets.List(held), resource, sets.List(want)),
			sentinel: ErrInvalidRequest,
		}
	}
	m.mu.Lock()
	opts, _ := m.core.ledger.RunOptions(podUID, request)
	m.mu.Unlock()
	if opts == nil {
		return nil, fmt.Errorf("claim %s/%s was unprepared while it was prepared", claim.Namespace, claim.Name)
	}
	return opts, nil
}

// allocateExact reserves ids of resource for the claim's request and asks
// the plugin to allocate them.
func (m *ManagerImpl) allocateExact(ctx context.Context, podUID, request, name string, ids []string) (*allocated, error) {
	log := m.log.WithValues(keyPodUID, podUID, keyContainer, request, keyResource, name)
	m.mu.Lock()
	ep, err := m.core.checkExact(podUID, request, name, ids, m.opts.Clock.Now())
	if err != nil {
		m.mu.Unlock()
		return nil, err
	}
	rid, err := m.core.ledger.Reserve(podUID, request, name, ids)
	m.mu.Unlock()
	if err != nil {
		return nil, &admissionError{msg: err.Error(), sentinel: ErrInsufficientDevices, cause: err}
	}
	log.V(3).Info("Allocating devices for a claim", keyDeviceIDs, ids)
	return m.callAllocate(ctx, log, name, ep, rid, ids)
}

// checkExact runs the admission checks for a claim's request of the
// devices ids, which must be known and healthy, and returns the endpoint to
// ask.
func (c *core) checkExact(podUID, request, name string, ids []string, now time.Time) (*endpoint.Endpoint, error) {
	if _, err := c.check(podUID, request, name, len(ids), false, now); err != nil {
		return nil, err
	}
	r := c.resources[name]
	if r.primary == nil {
		return nil, &admissionError{msg: "unknown Device Plugin " + name, sentinel: ErrUnknownPlugin}
	}
	if i := slices.IndexFunc(ids, func(id string) bool { return !r.isHealthy(id) }); i >= 0 {
		return nil, &admissionError{
			msg:      fmt.Sprintf("device %q of %s is unknown or unhealthy", ids[i], name),
			sentinel: ErrInsufficientDevices,
		}
	}
	return r.primary, nil
}

// UnprepareClaim releases every device the claim holds and writes the
// checkpoint. A claim that holds nothing is not an error, and the checkpoint
// is written again if an earlier write failed. While the claim is being
// prepared it fails: unprepare it once that call has returned.
func (m *ManagerImpl) UnprepareClaim(claimUID string) error {
	return m.dropClaim(ClaimPodUID(claimUID), false)
}

// PreparedClaims returns, sorted, the UIDs of the claims that hold devices.
func (m *ManagerImpl) PreparedClaims() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var uids []string
	for uid := range m.core.ledger.Pods() {
		if isClaim(uid) {
			uids = append(uids, strings.TrimPrefix(uid, claimUIDPrefix))
		}
	}
	slices.Sort(uids)
	return uids
}

// dropClaim is UnprepareClaim; inCall: the caller is a PrepareClaim of the
// claim.
func (m *ManagerImpl) dropClaim(podUID string, inCall bool) error {
	m.mu.Lock()
	if m.state == stopped {
		m.mu.Unlock()
		return ErrStopped
	}
	if a := m.core.pods[podUID]; a != nil && a.calls > 0 && !inCall {
		m.mu.Unlock()
		return fmt.Errorf("claim %s is being prepared; unprepare it once that ends", strings.TrimPrefix(podUID, claimUIDPrefix))
	}
	if m.core.ledger.HasPod(podUID) {
		m.signal(m.core.releaseClaim(podUID))
	}
	gen := m.core.gen
	m.mu.Unlock()
	if err := m.persist(gen); err != nil {
		return fmt.Errorf("claim %s released, but the checkpoint was not written: %w", strings.TrimPrefix(podUID, claimUIDPrefix), err)
	}
	return nil
}

// releaseClaim drops the records of the pod that stands for a claim.
func (c *core) releaseClaim(podUID string) effects {
	eff := effects{events: c.releasedEvents([]string{podUID}, ReleaseClaimUnprepared)}
	c.ledger.DeletePods(podUID)
	if a := c.pods[podUID]; a != nil && a.calls == 0 {
		delete(c.pods, podUID)
	}
	eff.merge(c.changed())
	eff.ready = true
	return eff
}

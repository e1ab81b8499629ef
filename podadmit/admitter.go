package podadmit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/uuid"

	"github.com/openkubelet/devmgr/devicemanager"
)

// Manager is what an Admitter needs of the device manager;
// *devicemanager.ManagerImpl is one.
type Manager interface {
	WaitForPlugins(ctx context.Context, pod *v1.Pod, container *v1.Container) error
	Allocate(ctx context.Context, pod *v1.Pod, container *v1.Container) error
	GetDeviceRunContainerOptions(ctx context.Context, pod *v1.Pod, container *v1.Container) (*devicemanager.DeviceRunContainerOptions, error)
	GetDevices(podUID, containerName string) devicemanager.ResourceDeviceInstances
	UpdateAllocatedDevices()
}

// Admission is the outcome of admitting one pod.
type Admission struct {
	UID             types.UID
	Name, Namespace string
	// Containers: init containers first, then app containers, in spec order.
	Containers []Container
}

// Container is what one container got.
type Container struct {
	Name string
	// Devices maps each resource to the sorted device IDs the container holds.
	Devices map[string][]string
	// RunOptions is what the runtime needs; nil when the container holds no
	// device.
	RunOptions *devicemanager.DeviceRunContainerOptions
}

// ErrInvalidPod marks a pod that cannot be admitted as written.
var ErrInvalidPod = errors.New("invalid pod")

// ErrAdmissionInProgress marks a second admission of a pod whose first
// admission has not returned yet.
var ErrAdmissionInProgress = errors.New("admission in progress")

// AdmitError reports the container whose admission failed. The pod holds
// nothing afterwards.
type AdmitError struct {
	// Container is empty when the pod as a whole was refused: by the
	// topology policy in the pod scope (SetPodTopology).
	Container string
	Err       error
}

func (e *AdmitError) Error() string {
	if e.Container == "" {
		return fmt.Sprintf("pod: %v", e.Err)
	}
	return fmt.Sprintf("container %q: %v", e.Container, e.Err)
}

// Unwrap returns the manager's error.
func (e *AdmitError) Unwrap() error { return e.Err }

// Admitter admits pods through one device manager and tracks the admitted
// ones. The zero value is not usable; call New.
type Admitter struct {
	mgr Manager
	// turn is held by the admission or restore in progress, so that pods are
	// admitted one at a time.
	turn chan struct{}

	// mu guards pods, admitting, order and align.
	mu   sync.Mutex
	pods map[string]*entry
	// admitting holds pods whose admission is in progress or waits for its
	// turn: they are active for the manager's garbage collection.
	admitting map[string]*v1.Pod
	order     []string // admission order of pods
	align     *alignment
}

type entry struct {
	pod       *v1.Pod
	admission Admission
}

// New returns an Admitter for mgr, with no pod. Pass its ActivePods to the
// manager's Start.
func New(mgr Manager) *Admitter {
	return &Admitter{
		mgr:       mgr,
		turn:      make(chan struct{}, 1),
		pods:      map[string]*entry{},
		admitting: map[string]*v1.Pod{},
	}
}

// ActivePods returns the admitted pods and those being admitted: the
// manager's devicemanager.ActivePodsFunc.
func (adm *Admitter) ActivePods() []*v1.Pod {
	adm.mu.Lock()
	defer adm.mu.Unlock()
	out := make([]*v1.Pod, 0, len(adm.pods)+len(adm.admitting))
	for _, uid := range adm.order {
		out = append(out, adm.pods[uid].pod)
	}
	for _, p := range adm.admitting {
		out = append(out, p)
	}
	return out
}

// waitTurn waits until no other admission or restore is in progress, or ctx
// is done.
func (adm *Admitter) waitTurn(ctx context.Context) error {
	select {
	case adm.turn <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (adm *Admitter) endTurn() { <-adm.turn }

// Admit allocates devices to every init container, then every app
// container of pod, in spec order, and returns what each got. Pods are
// admitted one at a time: Admit first waits, honouring ctx, for the plugins
// of the pod's resources (the manager's WaitForPlugins, so a pod waiting for
// its plugin holds up no other pod; each container's wait is bounded on its
// own, so a pod can wait that long once for each container whose plugin is
// not ready), then for an admission or restore in progress to end. A pod
// without a UID gets a generated one, and one without a namespace
// "default"; the caller's pod is not modified.
// Admitting an admitted pod (same UID) again returns the same answer.
//
// A pod the manager cannot reason about (no container, a container without
// a name or named twice, a negative limit) is refused with ErrInvalidPod.
// When a container is refused, what the pod got is released and the error is
// an *AdmitError naming the container, wrapping the manager's error (or the
// policy's *policy.AffinityError); one naming no container when the policy
// refused the whole pod (SetPodTopology).
func (adm *Admitter) Admit(ctx context.Context, pod *v1.Pod) (*Admission, error) {
	if err := validate(pod); err != nil {
		return nil, err
	}
	pod = pod.DeepCopy()
	if pod.UID == "" {
		pod.UID = uuid.NewUUID()
	}
	if pod.Namespace == "" {
		pod.Namespace = "default"
	}
	uid := string(pod.UID)
	adm.mu.Lock()
	if e, ok := adm.pods[uid]; ok {
		adm.mu.Unlock()
		a := e.admission
		return &a, nil
	}
	if _, busy := adm.admitting[uid]; busy {
		adm.mu.Unlock()
		return nil, fmt.Errorf("pod %s is being admitted: %w", uid, ErrAdmissionInProgress)
	}
	adm.admitting[uid] = pod
	adm.mu.Unlock()
	forget := func() {
		adm.mu.Lock()
		delete(adm.admitting, uid)
		adm.mu.Unlock()
	}

	// A pod whose plugin is not back waits for it before its turn, so that
	// other pods are admitted meanwhile.
	for _, c := range containersOf(pod) {
		if err := adm.mgr.WaitForPlugins(ctx, pod, c); err != nil {
			forget()
			return nil, &AdmitError{Container: c.Name, Err: err}
		}
	}
	if err := adm.waitTurn(ctx); err != nil {
		forget()
		return nil, fmt.Errorf("pod %s waited for another admission: %w", uid, err)
	}
	defer adm.endTurn()
	align := adm.alignment()
	a, err := admit(ctx, adm.mgr, align, pod)
	adm.mu.Lock()
	delete(adm.admitting, uid)
	if err == nil {
		adm.pods[uid] = &entry{pod: pod, admission: *a}
		adm.order = append(adm.order, uid)
	}
	adm.mu.Unlock()
	if err != nil {
		// The pod is not active any more: collect whatever it got, before
		// the next admission counts the free devices.
		adm.mgr.UpdateAllocatedDevices()
		align.forget(uid)
		return nil, err
	}
	return a, nil
}

func admit(ctx context.Context, mgr Manager, align *alignment, pod *v1.Pod) (*Admission, error) {
	a := &Admission{UID: pod.UID, Name: pod.Name, Namespace: pod.Namespace}
	if err := align.admitPod(pod); err != nil {
		return nil, &AdmitError{Err: err}
	}
	containers := containersOf(pod)
	for _, c := range containers {
		if err := align.admit(pod, c); err != nil {
			return nil, &AdmitError{Container: c.Name, Err: err}
		}
		if err := mgr.Allocate(ctx, pod, c); err != nil {
			return nil, &AdmitError{Container: c.Name, Err: err}
		}
	}
	for _, c := range containers {
		got, err := describe(ctx, mgr, pod, c)
		if err != nil {
			return nil, err
		}
		a.Containers = append(a.Containers, got)
	}
	return a, nil
}

// containersOf returns the init containers then the app containers of pod.
func containersOf(pod *v1.Pod) []*v1.Container {
	containers := make([]*v1.Container, 0, len(pod.Spec.InitContainers)+len(pod.Spec.Containers))
	for i := range pod.Spec.InitContainers {
		containers = append(containers, &pod.Spec.InitContainers[i])
	}
	for i := range pod.Spec.Containers {
		containers = append(containers, &pod.Spec.Containers[i])
	}
	return containers
}

// describe returns what container c of pod holds: its run options, then its
// devices (GetDeviceRunContainerOptions may allocate a missing record). When
// the run options cannot be had, the container is still described, with its
// devices and no run options, along with an *AdmitError.
func describe(ctx context.Context, mgr Manager, pod *v1.Pod, c *v1.Container) (Container, error) {
	opts, optsErr := mgr.GetDeviceRunContainerOptions(ctx, pod, c)
	devs := devicesOf(mgr, pod, c)
	if optsErr != nil {
		return Container{Name: c.Name, Devices: devs}, &AdmitError{Container: c.Name, Err: optsErr}
	}
	return Container{Name: c.Name, Devices: devs, RunOptions: opts}, nil
}

// devicesOf returns the sorted device IDs container c of pod holds, per
// resource.
func devicesOf(mgr Manager, pod *v1.Pod, c *v1.Container) map[string][]string {
	devs := map[string][]string{}
	for res, ids := range mgr.GetDevices(string(pod.UID), c.Name) {
		devs[res] = sets.List(sets.KeySet(ids))
	}
	return devs
}

// validate refuses pods the manager cannot reason about.
func validate(pod *v1.Pod) error {
	if pod == nil {
		return fmt.Errorf("%w: no pod", ErrInvalidPod)
	}
	if len(pod.Spec.Containers) == 0 {
		return fmt.Errorf("%w: spec.containers is empty", ErrInvalidPod)
	}
	seen := sets.New[string]()
	for _, c := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
		if strings.TrimSpace(c.Name) == "" {
			return fmt.Errorf("%w: a container has no name", ErrInvalidPod)
		}
		if seen.Has(c.Name) {
			return fmt.Errorf("%w: container name %q is used twice", ErrInvalidPod, c.Name)
		}
		seen.Insert(c.Name)
		for res, q := range c.Resources.Limits {
			if q.Sign() < 0 {
				return fmt.Errorf("%w: container %q: negative limit for %s", ErrInvalidPod, c.Name, res)
			}
		}
	}
	return nil
}

// Release forgets the admitted pod and frees its devices (through the
// manager's UpdateAllocatedDevices, as the kubelet's garbage collection of a
// pod that is no longer active). It reports whether the pod was admitted.
func (adm *Admitter) Release(uid types.UID) bool {
	adm.mu.Lock()
	_, ok := adm.pods[string(uid)]
	if ok {
		delete(adm.pods, string(uid))
		adm.order = slices.DeleteFunc(adm.order, func(u string) bool { return u == string(uid) })
	}
	adm.mu.Unlock()
	if ok {
		adm.mgr.UpdateAllocatedDevices()
		adm.alignment().forget(string(uid))
	}
	return ok
}

// Pods returns the admitted pods in admission order.
func (adm *Admitter) Pods() []Admission {
	adm.mu.Lock()
	defer adm.mu.Unlock()
	out := make([]Admission, 0, len(adm.order))
	for _, uid := range adm.order {
		out = append(out, adm.pods[uid].admission)
	}
	return out
}

// Pod returns one admitted pod.
func (adm *Admitter) Pod(uid types.UID) (Admission, bool) {
	adm.mu.Lock()
	defer adm.mu.Unlock()
	e, ok := adm.pods[string(uid)]
	if !ok {
		return Admission{}, false
	}
	return e.admission, true
}

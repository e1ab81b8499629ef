// Package node is the small part of a kubelet that devmgr's command needs
// around the device manager: the set of admitted pods (the manager's active
// pods), admission of a pod's containers in order, release, and taking the
// admitted pods back after the process restarts (AdmittedPods, Restore).
//
// A Node is safe for concurrent use. It starts nothing; its lifecycle is the
// manager's.
package node

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

// Manager is what a Node needs of the device manager.
type Manager interface {
	Allocate(ctx context.Context, pod *v1.Pod, container *v1.Container) error
	GetDeviceRunContainerOptions(ctx context.Context, pod *v1.Pod, container *v1.Container) (*devicemanager.DeviceRunContainerOptions, error)
	GetDevices(podUID, containerName string) devicemanager.ResourceDeviceInstances
	UpdateAllocatedDevices()
}

// Admission is the outcome of admitting one pod.
type Admission struct {
	UID, Name, Namespace string
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
	Container string
	Err       error
}

func (e *AdmitError) Error() string { return fmt.Sprintf("container %q: %v", e.Container, e.Err) }

// Unwrap returns the manager's error.
func (e *AdmitError) Unwrap() error { return e.Err }

// Node tracks admitted pods for one device manager.
type Node struct {
	mgr Manager

	// mu guards pods, admitting and order.
	mu   sync.Mutex
	pods map[string]*entry
	// admitting holds pods whose admission is in progress: they are active
	// for the manager's garbage collection.
	admitting map[string]*v1.Pod
	order     []string // admission order of pods
	align     *alignment
}

type entry struct {
	pod       *v1.Pod
	admission Admission
}

// New returns a Node for mgr. Pass its ActivePods to the manager's Start.
func New(mgr Manager) *Node {
	return &Node{mgr: mgr, pods: map[string]*entry{}, admitting: map[string]*v1.Pod{}}
}

// SetManager sets the manager once it exists (the manager's Start needs
// ActivePods first).
func (n *Node) SetManager(mgr Manager) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.mgr = mgr
}

// ActivePods returns the admitted pods and those being admitted.
func (n *Node) ActivePods() []*v1.Pod {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]*v1.Pod, 0, len(n.pods)+len(n.admitting))
	for _, uid := range n.order {
		out = append(out, n.pods[uid].pod)
	}
	for _, p := range n.admitting {
		out = append(out, p)
	}
	return out
}

// Admit allocates devices to every init container then every app container
// of pod, in order, and returns what each got. A pod without a UID gets a
// generated one. Admitting an admitted pod (same UID) again returns the same
// answer. When a container fails, the pod's devices are released and the
// error is an *AdmitError naming the container.
func (n *Node) Admit(ctx context.Context, pod *v1.Pod) (*Admission, error) {
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
	n.mu.Lock()
	if e, ok := n.pods[uid]; ok {
		n.mu.Unlock()
		a := e.admission
		return &a, nil
	}
	if _, busy := n.admitting[uid]; busy {
		n.mu.Unlock()
		return nil, fmt.Errorf("pod %s is being admitted: %w", uid, ErrAdmissionInProgress)
	}
	n.admitting[uid] = pod
	mgr := n.mgr
	n.mu.Unlock()

	a, err := admit(ctx, mgr, n.alignment(), pod)
	n.mu.Lock()
	delete(n.admitting, uid)
	if err == nil {
		n.pods[uid] = &entry{pod: pod, admission: *a}
		n.order = append(n.order, uid)
	}
	n.mu.Unlock()
	if err != nil {
		// The pod is not active any more: collect whatever it got.
		mgr.UpdateAllocatedDevices()
		n.alignment().forget(uid)
		return nil, err
	}
	return a, nil
}

func admit(ctx context.Context, mgr Manager, align *alignment, pod *v1.Pod) (*Admission, error) {
	a := &Admission{UID: string(pod.UID), Name: pod.Name, Namespace: pod.Namespace}
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
	devs := map[string][]string{}
	for res, ids := range mgr.GetDevices(string(pod.UID), c.Name) {
		devs[res] = sets.List(sets.KeySet(ids))
	}
	if optsErr != nil {
		return Container{Name: c.Name, Devices: devs}, &AdmitError{Container: c.Name, Err: optsErr}
	}
	return Container{Name: c.Name, Devices: devs, RunOptions: opts}, nil
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

// Release forgets the pod and frees its devices. It reports whether the pod
// was admitted.
func (n *Node) Release(uid string) bool {
	n.mu.Lock()
	_, ok := n.pods[uid]
	if ok {
		delete(n.pods, uid)
		n.order = slices.DeleteFunc(n.order, func(u string) bool { return u == uid })
	}
	mgr := n.mgr
	n.mu.Unlock()
	if ok {
		mgr.UpdateAllocatedDevices()
		n.alignment().forget(uid)
	}
	return ok
}

// Pods returns the admitted pods in admission order.
func (n *Node) Pods() []Admission {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]Admission, 0, len(n.order))
	for _, uid := range n.order {
		out = append(out, n.pods[uid].admission)
	}
	return out
}

// Pod returns one admitted pod.
func (n *Node) Pod(uid types.UID) (Admission, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	e, ok := n.pods[string(uid)]
	if !ok {
		return Admission{}, false
	}
	return e.admission, true
}

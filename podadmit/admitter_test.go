package podadmit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/openkubelet/devmgr/devicemanager"
)

// fakeManager hands out devices "<resource>-<n>" and fails containers named
// in fail.
type fakeManager struct {
	mu        sync.Mutex
	next      int
	held      map[string]map[string]devicemanager.ResourceDeviceInstances // pod -> container -> devices
	fail      map[string]error
	collected int
	admitter  *Admitter
}

// WaitForPlugins finds every plugin ready.
func (f *fakeManager) WaitForPlugins(context.Context, *v1.Pod, *v1.Container) error { return nil }

func (f *fakeManager) Allocate(_ context.Context, pod *v1.Pod, c *v1.Container) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail[c.Name]; err != nil {
		return err
	}
	if f.held == nil {
		f.held = map[string]map[string]devicemanager.ResourceDeviceInstances{}
	}
	uid := string(pod.UID)
	if f.held[uid] == nil {
		f.held[uid] = map[string]devicemanager.ResourceDeviceInstances{}
	}
	if _, ok := f.held[uid][c.Name]; ok {
		return nil
	}
	devs := devicemanager.ResourceDeviceInstances{}
	for res, q := range c.Resources.Limits {
		devs[string(res)] = devicemanager.DeviceInstances{}
		for range q.Value() {
			devs[string(res)][fmt.Sprintf("%s-%d", res, f.next)] = nil
			f.next++
		}
	}
	f.held[uid][c.Name] = devs
	return nil
}

func (f *fakeManager) GetDeviceRunContainerOptions(_ context.Context, pod *v1.Pod, c *v1.Container) (*devicemanager.DeviceRunContainerOptions, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.held[string(pod.UID)][c.Name]) == 0 {
		return nil, nil
	}
	return &devicemanager.DeviceRunContainerOptions{Envs: []devicemanager.EnvVar{{Name: "C", Value: c.Name}}}, nil
}

func (f *fakeManager) GetDevices(podUID, containerName string) devicemanager.ResourceDeviceInstances {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.held[podUID][containerName]
}

// UpdateAllocatedDevices drops pods the node does not list as active.
func (f *fakeManager) UpdateAllocatedDevices() {
	active := map[string]bool{}
	for _, p := range f.admitter.ActivePods() {
		active[string(p.UID)] = true
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.collected++
	for uid := range f.held {
		if !active[uid] {
			delete(f.held, uid)
		}
	}
}

func newTestAdmitter() (*Admitter, *fakeManager) {
	f := &fakeManager{fail: map[string]error{}}
	adm := New(f)
	f.admitter = adm
	return adm, f
}

func container(name string, gpus int64) v1.Container {
	return v1.Container{Name: name, Resources: v1.ResourceRequirements{Limits: v1.ResourceList{
		"example.com/gpu": *resource.NewQuantity(gpus, resource.DecimalSI)}}}
}

// initAppPlainPod has an init container with one gpu, an app container with
// two and an app container without device.
func initAppPlainPod() *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", UID: "u1"},
		Spec: v1.PodSpec{
			InitContainers: []v1.Container{container("init", 1)},
			Containers:     []v1.Container{container("app", 2), {Name: "plain"}},
		},
	}
}

func TestAdmittedPodIsAnsweredAgainUntilReleased(t *testing.T) {
	adm, f := newTestAdmitter()
	pod := initAppPlainPod()
	a, err := adm.Admit(context.Background(), pod)
	require.NoError(t, err)
	assert.Equal(t, "default", a.Namespace)
	require.Len(t, a.Containers, 3)
	assert.Equal(t, "init", a.Containers[0].Name)
	assert.Equal(t, map[string][]string{"example.com/gpu": {"example.com/gpu-0"}}, a.Containers[0].Devices)
	assert.Equal(t, map[string][]string{"example.com/gpu": {"example.com/gpu-1", "example.com/gpu-2"}}, a.Containers[1].Devices)
	assert.Empty(t, a.Containers[2].Devices)
	assert.Nil(t, a.Containers[2].RunOptions)

	again, err := adm.Admit(context.Background(), pod)
	require.NoError(t, err)
	assert.Equal(t, a, again, "idempotent")
	assert.Len(t, adm.Pods(), 1)
	assert.Len(t, adm.ActivePods(), 1)
	got, ok := adm.Pod("u1")
	assert.True(t, ok)
	assert.Equal(t, *a, got)

	assert.True(t, adm.Release("u1"))
	assert.False(t, adm.Release("u1"))
	assert.Empty(t, adm.Pods())
	assert.Empty(t, f.held, "released devices")
	_, ok = adm.Pod("u1")
	assert.False(t, ok)
}

func TestAdmitGeneratesUID(t *testing.T) {
	adm, _ := newTestAdmitter()
	pod := &v1.Pod{Spec: v1.PodSpec{Containers: []v1.Container{container("app", 1)}}}
	a, err := adm.Admit(context.Background(), pod)
	require.NoError(t, err)
	assert.NotEmpty(t, a.UID)
	assert.Empty(t, pod.UID, "the caller's pod is not modified")
}

// A failing container releases what earlier containers of the pod got.
func TestAdmitFailureHoldsNothing(t *testing.T) {
	adm, f := newTestAdmitter()
	boom := errors.New("requested number of devices unavailable")
	f.fail["app"] = boom
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{UID: "u"},
		Spec:       v1.PodSpec{InitContainers: []v1.Container{container("init", 1)}, Containers: []v1.Container{container("app", 1)}},
	}
	_, err := adm.Admit(context.Background(), pod)
	var ae *AdmitError
	require.ErrorAs(t, err, &ae)
	assert.Equal(t, "app", ae.Container)
	assert.ErrorIs(t, err, boom)
	assert.Empty(t, f.held)
	assert.Empty(t, adm.ActivePods())
}

func TestAdmitRefusesInvalidPods(t *testing.T) {
	adm, _ := newTestAdmitter()
	neg := container("a", 1)
	neg.Resources.Limits["example.com/gpu"] = resource.MustParse("-1")
	for name, pod := range map[string]*v1.Pod{
		"nil":           nil,
		"no containers": {},
		"unnamed":       {Spec: v1.PodSpec{Containers: []v1.Container{{}}}},
		"duplicate":     {Spec: v1.PodSpec{InitContainers: []v1.Container{{Name: "a"}}, Containers: []v1.Container{{Name: "a"}}}},
		"negative":      {Spec: v1.PodSpec{Containers: []v1.Container{neg}}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := adm.Admit(context.Background(), pod)
			assert.ErrorIs(t, err, ErrInvalidPod)
		})
	}
}

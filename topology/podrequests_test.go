package topology

import (
	"testing"

	"github.com/stretchr/testify/assert"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// ctr returns a container with the given limits ("name", "quantity", ...).
func ctr(name string, kv ...string) v1.Container {
	l := v1.ResourceList{}
	for i := 0; i < len(kv); i += 2 {
		l[v1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return v1.Container{Name: name, Resources: v1.ResourceRequirements{Limits: l}}
}

// sidecar returns an init container with restartPolicy Always.
func sidecar(name string, kv ...string) v1.Container {
	c := ctr(name, kv...)
	always := v1.ContainerRestartPolicyAlways
	c.RestartPolicy = &always
	return c
}

// TestGetPodDeviceRequest: the table of the kubelet's test of the same name,
// cpu and memory included in the limits and dropped like the kubelet's
// caller does.
func TestGetPodDeviceRequest(t *testing.T) {
	devices := []string{"gpu", "nic"}
	tests := []struct {
		name string
		pod  *v1.Pod
		want map[string]int64
	}{
		{name: "empty pod", pod: &v1.Pod{}, want: map[string]int64{}},
		{
			name: "one init container",
			pod: &v1.Pod{Spec: v1.PodSpec{InitContainers: []v1.Container{
				ctr("i1", "cpu", "2", "memory", "1G", "gpu", "2"),
			}}},
			want: map[string]int64{"gpu": 2},
		},
		{
			name: "two init containers: the larger",
			pod: &v1.Pod{Spec: v1.PodSpec{InitContainers: []v1.Container{
				ctr("i1", "cpu", "2", "memory", "1G", "gpu", "2"),
				ctr("i2", "cpu", "2", "memory", "1G", "gpu", "4"),
			}}},
			want: map[string]int64{"gpu": 4},
		},
		{
			name: "one app container",
			pod: &v1.Pod{Spec: v1.PodSpec{Containers: []v1.Container{
				ctr("c1", "cpu", "2", "memory", "1G", "gpu", "2"),
			}}},
			want: map[string]int64{"gpu": 2},
		},
		{
			name: "init and app containers ask the same",
			pod: &v1.Pod{Spec: v1.PodSpec{
				InitContainers: []v1.Container{
					ctr("i1", "cpu", "2", "memory", "1G", "gpu", "2", "nic", "2"),
					ctr("i2", "cpu", "2", "memory", "1G", "gpu", "2", "nic", "2"),
				},
				Containers: []v1.Container{
					ctr("c1", "cpu", "2", "memory", "1G", "gpu", "1", "nic", "1"),
					ctr("c2", "cpu", "2", "memory", "1G", "gpu", "1", "nic", "1"),
				},
			}},
			want: map[string]int64{"gpu": 2, "nic": 2},
		},
		{
			name: "init containers ask more than app containers",
			pod: &v1.Pod{Spec: v1.PodSpec{
				InitContainers: []v1.Container{
					ctr("i1", "cpu", "2", "memory", "1G", "gpu", "2", "nic", "1"),
					ctr("i2", "cpu", "2", "memory", "1G", "gpu", "3", "nic", "2"),
				},
				Containers: []v1.Container{
					ctr("c1", "cpu", "1", "memory", "1G", "gpu", "1", "nic", "1"),
					ctr("c2", "cpu", "1", "memory", "1G", "gpu", "1"),
				},
			}},
			want: map[string]int64{"gpu": 3, "nic": 2},
		},
		{
			name: "app containers ask more than init containers",
			pod: &v1.Pod{Spec: v1.PodSpec{
				InitContainers: []v1.Container{
					ctr("i1", "cpu", "2", "memory", "1G", "gpu", "2", "nic", "1"),
					ctr("i2", "cpu", "2", "memory", "1G", "gpu", "2", "nic", "1"),
				},
				Containers: []v1.Container{
					ctr("c1", "cpu", "1", "memory", "1G", "gpu", "3", "nic", "2"),
					ctr("c2", "cpu", "1", "memory", "1G", "gpu", "3", "nic", "2"),
				},
			}},
			want: map[string]int64{"gpu": 6, "nic": 4},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := PodRequests(tc.pod)
			filtered := make(map[string]int64)
			for _, res := range devices {
				if n, ok := got[res]; ok {
					filtered[res] = n
				}
			}
			assert.Equal(t, tc.want, filtered)
		})
	}
}

// TestPodRequestsSidecars: restartable init containers (the sidecar formula
// of the kubelet's pod limits).
func TestPodRequestsSidecars(t *testing.T) {
	tests := []struct {
		name string
		spec v1.PodSpec
		want map[string]int64
	}{
		{
			name: "sidecars add to the app containers",
			spec: v1.PodSpec{
				InitContainers: []v1.Container{
					ctr("init", "gpu", "3"),
					sidecar("sa", "gpu", "1"),
					sidecar("sb", "gpu", "2"),
				},
				Containers: []v1.Container{ctr("app1", "gpu", "1"), ctr("app2", "gpu", "2")},
			},
			want: map[string]int64{"gpu": 6}, // 1+2 apps + 1+2 sidecars; init peak 3
		},
		{
			name: "an init container after a sidecar runs beside it",
			spec: v1.PodSpec{
				InitContainers: []v1.Container{
					sidecar("sa", "gpu", "1"),
					ctr("init", "gpu", "4"),
				},
				Containers: []v1.Container{ctr("app", "gpu", "1")},
			},
			want: map[string]int64{"gpu": 5}, // init 4 + sidecar 1 > app 1 + sidecar 1
		},
		{
			name: "an init container before the sidecars does not",
			spec: v1.PodSpec{
				InitContainers: []v1.Container{
					ctr("init", "gpu", "4"),
					sidecar("sa", "gpu", "1"),
				},
				Containers: []v1.Container{ctr("app", "gpu", "1")},
			},
			want: map[string]int64{"gpu": 4},
		},
		{
			name: "sidecar resources carry into later init containers that do not ask for them",
			spec: v1.PodSpec{
				InitContainers: []v1.Container{
					sidecar("sa", "nic", "2"),
					ctr("init", "gpu", "1"),
				},
			},
			want: map[string]int64{"gpu": 1, "nic": 2},
		},
		{
			name: "restart policy other than Always is a regular init container",
			spec: v1.PodSpec{
				InitContainers: []v1.Container{
					func() v1.Container {
						c := ctr("init", "gpu", "2")
						never := v1.ContainerRestartPolicy("Never")
						c.RestartPolicy = &never
						return c
					}(),
				},
				Containers: []v1.Container{ctr("app", "gpu", "1")},
			},
			want: map[string]int64{"gpu": 2},
		},
		{
			name: "fractions round up, zero limits are kept",
			spec: v1.PodSpec{Containers: []v1.Container{ctr("app", "cpu", "500m", "gpu", "0")}},
			want: map[string]int64{"cpu": 1, "gpu": 0},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, PodRequests(&v1.Pod{Spec: tc.spec}))
		})
	}
}

func TestPodRequestsNilPod(t *testing.T) {
	got := PodRequests(nil)
	assert.NotNil(t, got)
	assert.Empty(t, got)
}

package podstate

import (
	"testing"

	"github.com/stretchr/testify/assert"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Upstream TestDeviceRunContainerOptions, in our words; the order is now fixed
// (resources sorted), so slices are compared exactly.
func TestDeviceRunContainerOptions(t *testing.T) {
	const (
		r1 = "example1.com/resource1"
		r2 = "example2.com/resource2"
	)
	cases := []struct {
		name  string
		resps map[string]*pluginapi.ContainerAllocateResponse
		want  *RunOptions
	}{
		{"empty response", map[string]*pluginapi.ContainerAllocateResponse{r1: newResp()}, &RunOptions{}},
		{"cdi devices kept in response order",
			map[string]*pluginapi.ContainerAllocateResponse{
				r1: newResp(withCDI("vendor2.com/class2=device2", "vendor1.com/class1=device1")),
			},
			&RunOptions{CDIDevices: []CDIDevice{{"vendor2.com/class2=device2"}, {"vendor1.com/class1=device1"}}}},
		{"cdi devices of two resources concatenated",
			map[string]*pluginapi.ContainerAllocateResponse{
				r2: newResp(withCDI("vendor3.com/class3=device3", "vendor4.com/class4=device4")),
				r1: newResp(withCDI("vendor1.com/class1=device1", "vendor2.com/class2=device2")),
			},
			&RunOptions{CDIDevices: []CDIDevice{
				{"vendor1.com/class1=device1"}, {"vendor2.com/class2=device2"},
				{"vendor3.com/class3=device3"}, {"vendor4.com/class4=device4"},
			}}},
		{"duplicate cdi device emitted once",
			map[string]*pluginapi.ContainerAllocateResponse{
				r1: newResp(withCDI("vendor1.com/class1=device1", "vendor2.com/class2=device2")),
				r2: newResp(withCDI("vendor2.com/class2=device2", "vendor3.com/class3=device3")),
			},
			&RunOptions{CDIDevices: []CDIDevice{
				{"vendor1.com/class1=device1"}, {"vendor2.com/class2=device2"}, {"vendor3.com/class3=device3"},
			}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := NewLedger()
			for res, resp := range tc.resps {
				l.Insert("pod", "container", res, nil, resp)
			}
			got, conflicts := l.RunOptions("pod", "container")
			assert.Equal(t, tc.want, got)
			assert.Empty(t, conflicts)
		})
	}
}

func TestRunOptionsMerge(t *testing.T) {
	const (
		ra = "a.example.com/gpu"
		rb = "b.example.com/nic"
		rc = "c.example.com/none"
	)
	l := NewLedger()
	l.Insert("pod", "ctr", rb, nil, newResp(
		withEnvs("SHARED", "from-b", "B", "1", "SAME", "x"),
		withDevices("/dev/b", "/dev/b0", "/dev/shared", "/dev/host-b"),
		withMounts("/lib/b", "/usr/lib/b", "/lib/shared", "/host/b"),
		withAnnotations("note", "b", "b-only", "1"),
	))
	l.Insert("pod", "ctr", ra, nil, newResp(
		withEnvs("SHARED", "from-a", "A", "1", "SAME", "x"),
		withDevices("/dev/shared", "/dev/host-a", "/dev/a", "/dev/a0", "/dev/a", "/dev/a-dup"),
		withMounts("/lib/shared", "/host/a"),
		withAnnotations("note", "a"),
	))
	l.Insert("pod", "ctr", rc, nil, nil) // no response: skipped
	l.Insert("pod", "other", ra, nil, newResp(withEnvs("OTHER", "1")))

	got, conflicts := l.RunOptions("pod", "ctr")
	assert.Equal(t, &RunOptions{
		Envs: []EnvVar{{"A", "1"}, {"SAME", "x"}, {"SHARED", "from-a"}, {"B", "1"}},
		Mounts: []Mount{
			{Name: "/lib/shared", ContainerPath: "/lib/shared", HostPath: "/host/a", ReadOnly: true},
			{Name: "/lib/b", ContainerPath: "/lib/b", HostPath: "/usr/lib/b", ReadOnly: true},
		},
		Devices: []DeviceInfo{
			{PathOnHost: "/dev/host-a", PathInContainer: "/dev/shared", Permissions: "mrw"},
			{PathOnHost: "/dev/a0", PathInContainer: "/dev/a", Permissions: "mrw"},
			{PathOnHost: "/dev/b0", PathInContainer: "/dev/b", Permissions: "mrw"},
		},
		Annotations: []Annotation{{"note", "a"}, {"b-only", "1"}},
	}, got)
	assert.Equal(t, []Conflict{
		{Kind: "device", Key: "/dev/a", Resource: ra, Kept: "/dev/a0", Dropped: "/dev/a-dup"},
		{Kind: "env", Key: "SHARED", Resource: rb, Kept: "from-a", Dropped: "from-b"},
		{Kind: "device", Key: "/dev/shared", Resource: rb, Kept: "/dev/host-a", Dropped: "/dev/host-b"},
		{Kind: "mount", Key: "/lib/shared", Resource: rb, Kept: "/host/a", Dropped: "/host/b"},
		{Kind: "annotation", Key: "note", Resource: rb, Kept: "a", Dropped: "b"},
	}, conflicts)
	assert.Equal(t, `env "SHARED" from resource "b.example.com/nic": value "from-b" ignored, "from-a" kept`,
		conflicts[1].String())

	again, _ := l.RunOptions("pod", "ctr")
	assert.Equal(t, got, again, "deterministic")

	only, conflicts := l.RunOptions("pod", "other")
	assert.Equal(t, &RunOptions{Envs: []EnvVar{{"OTHER", "1"}}}, only)
	assert.Nil(t, conflicts)
}

func TestRunOptionsUnknown(t *testing.T) {
	l := NewLedger()
	l.Insert("pod", "ctr", res1, nil, nil)
	cases := []struct {
		name     string
		pod, ctr string
		want     *RunOptions
	}{
		{"unknown pod", "nope", "ctr", nil},
		{"unknown container", "pod", "nope", nil},
		{"only records without response", "pod", "ctr", &RunOptions{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, conflicts := l.RunOptions(tc.pod, tc.ctr)
			assert.Equal(t, tc.want, got)
			assert.Nil(t, conflicts)
		})
	}
}

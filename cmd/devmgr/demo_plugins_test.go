package main

import (
	"context"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/testdata/demo"
)

func TestPackOnNUMA(t *testing.T) {
	// gpu-0 and gpu-2 on node 0, gpu-1 and gpu-3 on node 1, as in the demo.
	numaOf := map[string]int64{"gpu-0": 0, "gpu-1": 1, "gpu-2": 0, "gpu-3": 1}
	all := []string{"gpu-0", "gpu-1", "gpu-2", "gpu-3"}
	for _, tc := range []struct {
		name      string
		available []string
		must      []string
		size      int
		want      []string
	}{
		{name: "one device: lowest of the best-fitting nodes", available: all, size: 1, want: []string{"gpu-0"}},
		{name: "two devices on one node, not the first two IDs", available: all, size: 2, want: []string{"gpu-0", "gpu-2"}},
		{name: "must-include decides the node", available: all, must: []string{"gpu-3"}, size: 2, want: []string{"gpu-3", "gpu-1"}},
		{name: "best fit: the node with fewer free devices", available: []string{"gpu-0", "gpu-1", "gpu-3"}, size: 1, want: []string{"gpu-0"}},
		{name: "best fit skips a node too small", available: []string{"gpu-0", "gpu-1", "gpu-3"}, size: 2, want: []string{"gpu-1", "gpu-3"}},
		{name: "no single node fits: sorted order", available: all, size: 3, want: []string{"gpu-0", "gpu-1", "gpu-2"}},
		{name: "must-include on two nodes: sorted order", available: all, must: []string{"gpu-0", "gpu-1"}, size: 3, want: []string{"gpu-0", "gpu-1", "gpu-2"}},
		{name: "must-include covers the request", available: all, must: []string{"gpu-2", "gpu-2"}, size: 1, want: []string{"gpu-2"}},
		{name: "unknown devices count as node -1", available: []string{"x", "gpu-0", "y"}, size: 2, want: []string{"x", "y"}},
		{name: "fewer available than asked", available: []string{"gpu-1"}, size: 2, want: []string{"gpu-1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, packOnNUMA(numaOf, tc.available, tc.must, tc.size))
		})
	}
}

func TestPackOnOneNUMANodeAnswersEveryContainerRequest(t *testing.T) {
	f := packOnOneNUMANode(demoDevices("gpu", 4, func(i int) int64 { return int64(i % 2) }))
	resp, err := f(context.Background(), &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: []string{"gpu-0", "gpu-1", "gpu-2", "gpu-3"}, AllocationSize: 2},
		{AvailableDeviceIDs: []string{"gpu-1", "gpu-2", "gpu-3"}, MustIncludeDeviceIDs: []string{"gpu-2"}, AllocationSize: 1},
	}})
	require.NoError(t, err)
	require.Len(t, resp.GetContainerResponses(), 2)
	assert.Equal(t, []string{"gpu-0", "gpu-2"}, resp.GetContainerResponses()[0].GetDeviceIDs())
	assert.Equal(t, []string{"gpu-2"}, resp.GetContainerResponses()[1].GetDeviceIDs())
}

func TestDemoPodsAreEmbedded(t *testing.T) {
	pods, err := loadDemoPods(demo.Pods)
	require.NoError(t, err)
	var names []string
	for _, p := range pods {
		names = append(names, p.pod.Name)
	}
	assert.Equal(t, []string{"training", "inference", "batch"}, names)

	training := pods[0].pod
	kinds := map[string]string{}
	for _, c := range append(training.Spec.InitContainers, training.Spec.Containers...) {
		kinds[c.Name] = demoContainerKind(training, c.Name)
	}
	assert.Equal(t, map[string]string{"warmup": demoKindInit, "net-agent": demoKindSidecar, "trainer": demoKindApp}, kinds)
	q := training.Spec.Containers[0].Resources.Limits[demoGPU]
	assert.Equal(t, int64(2), q.Value(), "the app container asks for 2 GPUs")
}

func TestLoadDemoPodsGivesUIDs(t *testing.T) {
	pods, err := loadDemoPods(fstest.MapFS{
		"b.yaml": {Data: []byte("kind: Pod\nmetadata: {name: b}\nspec: {containers: [{name: c}]}\n")},
		"a.yaml": {Data: []byte("kind: Pod\nmetadata: {name: a, uid: given}\nspec: {containers: [{name: c}]}\n")},
	})
	require.NoError(t, err)
	require.Len(t, pods, 2)
	assert.Equal(t, "a.yaml", pods[0].file)
	assert.Equal(t, "given", string(pods[0].pod.UID))
	assert.NotEmpty(t, pods[1].pod.UID)
}

func TestLoadDemoPodsRejectsBadManifests(t *testing.T) {
	for _, tc := range []struct {
		name string
		fsys fstest.MapFS
		want string
	}{
		{name: "none", fsys: fstest.MapFS{"README": {Data: []byte("x")}}, want: "no pod manifests"},
		{name: "unknown field", fsys: fstest.MapFS{"a.yaml": {Data: []byte("kind: Pod\nmetadata: {name: a}\nspec: {containerz: []}\n")}}, want: `unknown field "containerz"`},
		{name: "not a pod", fsys: fstest.MapFS{"a.yaml": {Data: []byte("kind: Service\nmetadata: {name: a}\n")}}, want: `want kind Pod`},
		{name: "not YAML", fsys: fstest.MapFS{"a.yaml": {Data: []byte("kind: [")}}, want: "pod manifest a.yaml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadDemoPods(tc.fsys)
			assert.ErrorContains(t, err, tc.want)
		})
	}
}

// The root help's example says what the demo does: as many fake plugins and
// pods as it starts and admits.
func TestRootHelpCountsTheDemo(t *testing.T) {
	pods, err := loadDemoPods(demo.Pods)
	require.NoError(t, err)
	number := []string{"no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"}
	require.Less(t, len(pods), len(number))
	require.Less(t, len(demoPluginSpecs()), len(number))
	want := number[len(demoPluginSpecs())] + " fake plugins, " + number[len(pods)] + " pods"
	assert.Contains(t, newRootCmd().Example, want)
}

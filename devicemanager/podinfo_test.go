package devicemanager

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openkubelet/devmgr/plugintest"
	"github.com/openkubelet/devmgr/podinfo"
)

// podInfoRun admits a pod of one container through a plugin that asks for
// PreStartContainer and answers GetPreferredAllocation, gets its run options,
// and returns the plugin's calls.
func podInfoRun(t *testing.T, send bool, uid, container string) *plugintest.Plugin {
	h := newHarness(t, func(o *Options) { o.SendPodInfo = send }).start()
	p := h.registered(res1, devices("g", 3), func(o *plugintest.Options) {
		o.PreStartRequired = true
		o.GetPreferredAllocationAvailable = true
	})
	pod := newPod(uid, ctr(container, res1, 2))
	h.pods.add(pod)
	require.NoError(t, h.admit(pod))
	_, err := h.m.GetDeviceRunContainerOptions(context.Background(), pod, &pod.Spec.Containers[0])
	require.NoError(t, err)
	return p
}

var podInfoMethods = []plugintest.Method{
	plugintest.MethodGetPreferredAllocation, plugintest.MethodAllocate, plugintest.MethodPreStartContainer,
}

func TestSendPodInfoNamesThePodInEveryCallForIt(t *testing.T) {
	p := podInfoRun(t, true, "uid-1", "app")
	want := podinfo.Info{Kind: podinfo.KindPod, Namespace: "default", Name: "pod-uid-1", UID: "uid-1", Container: "app"}
	for _, m := range podInfoMethods {
		calls := p.CallsOf(m)
		require.Len(t, calls, 1, "%s", m)
		got, ok := calls[0].PodInfo()
		assert.True(t, ok, "%s carries the pod", m)
		assert.Equal(t, want, got, "%s", m)
	}
}

// The kubelet sends no metadata; neither does the manager by default.
func TestWithoutSendPodInfoNoCallNamesAPod(t *testing.T) {
	p := podInfoRun(t, false, "uid-1", "app")
	for _, m := range podInfoMethods {
		calls := p.CallsOf(m)
		require.Len(t, calls, 1, "%s", m)
		_, ok := calls[0].PodInfo()
		assert.False(t, ok, "%s", m)
	}
}

// Allocate accepts any UTF-8 UID and container name; gRPC carries only
// printable ASCII in metadata, and the call must not fail for it.
func TestSendPodInfoCarriesNamesGRPCWouldRefuse(t *testing.T) {
	p := podInfoRun(t, true, "uid é\t1", "app ü")
	calls := p.CallsOf(plugintest.MethodAllocate)
	require.Len(t, calls, 1)
	got, ok := calls[0].PodInfo()
	require.True(t, ok)
	assert.Equal(t, "uid é\t1", got.UID)
	assert.Equal(t, "app ü", got.Container)
}

package podadmit_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/plugintest"
	"github.com/openkubelet/devmgr/podadmit"
)

// A pod whose plugin has not listed its devices yet waits for it without
// holding up the admission of another pod, whose resource is ready; it is
// admitted once its plugin lists its devices.
func TestPodWaitingForItsPluginHoldsUpNoOtherPod(t *testing.T) {
	const nic = "example.com/nic"
	dir, err := os.MkdirTemp("", "pa")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	waiting := make(chan struct{}, 1)
	logger := funcr.New(func(_, args string) {
		if strings.Contains(args, `"Waiting for a device plugin"`) {
			select {
			case waiting <- struct{}{}:
			default:
			}
		}
	}, funcr.Options{Verbosity: 3})
	mgr, err := devicemanager.NewManagerImpl(devicemanager.Options{
		SocketDir: dir, PluginWaitTimeout: time.Minute, Logger: logger,
	})
	require.NoError(t, err)
	adm := podadmit.New(mgr)
	require.NoError(t, mgr.Start(adm.ActivePods, nil, nil, nil))
	t.Cleanup(func() { _ = mgr.Stop() })
	gpuPlugin, err := startGPUPlugin(mgr, dir, 1)
	require.NoError(t, err)
	t.Cleanup(gpuPlugin.Stop)

	nicPlugin, err := plugintest.New(plugintest.Options{ResourceName: nic, SocketDir: dir,
		Devices: []*pluginapi.Device{{ID: "nic-0", Health: pluginapi.Healthy}}})
	require.NoError(t, err)
	t.Cleanup(nicPlugin.Stop)
	listDevices := nicPlugin.Block(plugintest.MethodListAndWatch)
	t.Cleanup(listDevices)
	require.NoError(t, nicPlugin.Start())
	require.NoError(t, nicPlugin.Register(filepath.Join(dir, devicemanager.KubeletSocketName)))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = nicPlugin.WaitForCalls(ctx, plugintest.MethodListAndWatch, 1)
	require.NoError(t, err, "the manager follows the nic plugin")

	type result struct {
		a   *podadmit.Admission
		err error
	}
	first := make(chan result, 1)
	go func() {
		a, err := adm.Admit(ctx, &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{UID: "a"},
			Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c", Resources: v1.ResourceRequirements{
				Limits: v1.ResourceList{nic: *resource.NewQuantity(1, resource.DecimalSI)}}}}},
		})
		first <- result{a, err}
	}()
	select {
	case <-waiting:
	case r := <-first:
		require.FailNow(t, "pod a did not wait for its plugin", "%+v", r)
	case <-ctx.Done():
		require.FailNow(t, "pod a did not wait for its plugin")
	}

	bctx, bcancel := context.WithTimeout(ctx, 5*time.Second)
	defer bcancel()
	b, err := adm.Admit(bctx, &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{UID: "b"},
		Spec:       v1.PodSpec{Containers: []v1.Container{gpus("c", 1)}},
	})
	require.NoError(t, err, "pod b is admitted while pod a waits for its plugin")
	assert.Equal(t, map[string][]string{gpu: {"gpu-0"}}, b.Containers[0].Devices)
	select {
	case r := <-first:
		require.FailNow(t, "pod a stopped waiting before its plugin listed its devices", "%+v", r)
	default:
	}

	listDevices()
	select {
	case r := <-first:
		require.NoError(t, r.err)
		assert.Equal(t, map[string][]string{nic: {"nic-0"}}, r.a.Containers[0].Devices)
	case <-ctx.Done():
		require.FailNow(t, "pod a was not admitted once its plugin listed its devices")
	}
}

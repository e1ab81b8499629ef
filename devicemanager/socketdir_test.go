package devicemanager

import (
	"errors"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/klog/v2/ktesting"
)

type labelCall struct{ path, label string }

// fakeSELinux replaces the SELinux calls for the test: enabled or not, and
// labelling fails with err.
func fakeSELinux(t *testing.T, enabled bool, err error) *[]labelCall {
	var calls []labelCall
	oldEnabled, oldSet := selinuxEnabled, setFileLabel
	selinuxEnabled = func() bool { return enabled }
	setFileLabel = func(path, label string) error {
		calls = append(calls, labelCall{path, label})
		return err
	}
	t.Cleanup(func() { selinuxEnabled, setFileLabel = oldEnabled, oldSet })
	return &calls
}

// With SELinux enabled, Start labels the socket directory as the kubelet
// labels its device-plugins directory, so that plugins in confined
// containers can use it; a label that cannot be set is logged and Start
// goes on, as in the kubelet. Without SELinux nothing is labelled.
func TestStartLabelsSocketDirForSELinux(t *testing.T) {
	t.Run("enabled", func(t *testing.T) {
		calls := fakeSELinux(t, true, nil)
		h := newHarness(t).start()
		assert.Equal(t, []labelCall{{h.dir, "system_u:object_r:container_file_t:s0"}}, *calls)
	})
	t.Run("disabled", func(t *testing.T) {
		calls := fakeSELinux(t, false, nil)
		newHarness(t).start()
		assert.Empty(t, *calls)
	})
	t.Run("labelling fails", func(t *testing.T) {
		failure := errors.New("setxattr: operation not supported")
		calls := fakeSELinux(t, true, failure)
		logger, buf := bufferedLogger(t)
		h := newHarness(t, func(o *Options) { o.Logger = logger }).start()
		require.Len(t, *calls, 1)
		require.NoError(t, h.m.HealthCheck(), "Start goes on")
		var logged bool
		for _, e := range buf.Data() {
			if e.Type == ktesting.LogError && errors.Is(e.Err, failure) {
				logged = true
				assert.Contains(t, e.Message, "SELinux label of the socket directory")
			}
		}
		assert.True(t, logged, "the failure is logged: %s", buf.String())
	})
	t.Run("directory in use", func(t *testing.T) {
		calls := fakeSELinux(t, true, nil)
		h := newHarness(t)
		kubelet, err := net.Listen("unix", h.kubeletSocket())
		require.NoError(t, err)
		defer kubelet.Close()
		require.ErrorIs(t, h.m.Start(nil, nil, nil, nil), ErrSocketInUse)
		assert.Empty(t, *calls, "a directory in use is not relabelled")
	})
}

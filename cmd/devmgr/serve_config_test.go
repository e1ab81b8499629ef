package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestServeConfig(t *testing.T) {
	sys := t.TempDir()
	for _, n := range []string{"node0", "node3", "nodeX"} {
		require.NoError(t, os.MkdirAll(filepath.Join(sys, "sys/devices/system/node", n), 0o755))
	}
	noNUMA := t.TempDir()
	dir := t.TempDir()

	t.Run("defaults", func(t *testing.T) {
		o := &serveOptions{socketDir: dir, controlSocket: "ctl.sock", stopGracePeriod: time.Minute}
		cfg, err := o.config(sys)
		require.NoError(t, err)
		assert.Equal(t, dir, cfg.checkpointDir, "the checkpoint directory defaults to the socket directory")
		assert.Equal(t, []int{0, 3}, cfg.numaNodes, "discovered from sysfs")
		assert.True(t, filepath.IsAbs(cfg.controlSocket), "relative paths are made absolute")

		cfg, err = o.config(noNUMA)
		require.NoError(t, err)
		assert.Equal(t, []int{0}, cfg.numaNodes, "a machine without NUMA information is node 0")
	})
	t.Run("given NUMA nodes", func(t *testing.T) {
		o := &serveOptions{socketDir: dir, controlSocket: "/c.sock", numaNodes: []int{1, 0, 1}, stopGracePeriod: time.Minute}
		cfg, err := o.config(sys)
		require.NoError(t, err)
		assert.Equal(t, []int{0, 1}, cfg.numaNodes, "sorted, without repeats, sysfs not read")
	})
	for name, tc := range map[string]struct {
		o    serveOptions
		want string
	}{
		"long control socket":            {serveOptions{socketDir: dir, controlSocket: "/" + strings.Repeat("x", 120)}, "a unix socket path holds at most 107"},
		"control socket is kubelet.sock": {serveOptions{socketDir: dir, controlSocket: filepath.Join(dir, "kubelet.sock")}, "is the registration socket"},
		"grace period":                   {serveOptions{socketDir: dir, controlSocket: "/c.sock", numaNodes: []int{0}}, "--stop-grace-period must be positive"},
		"negative plugin wait":           {serveOptions{socketDir: dir, controlSocket: "/c.sock", numaNodes: []int{0}, stopGracePeriod: time.Minute, pluginWait: -time.Second}, "--plugin-wait must not be negative, not -1s"},
		"empty socket dir":               {serveOptions{controlSocket: "/c.sock"}, "--socket-dir must not be empty"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := tc.o.config(sys)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestNewLogger(t *testing.T) {
	var b syncBuffer
	l, err := newLogger("json", 1, &b)
	require.NoError(t, err)
	l.Info("Hello", "resourceName", "example.com/gpu")
	l.V(2).Info("Hidden")
	assert.Contains(t, b.String(), `"msg":"Hello"`)
	assert.Contains(t, b.String(), `"resourceName":"example.com/gpu"`)
	assert.NotContains(t, b.String(), "Hidden")

	_, err = newLogger("text", -1, &b)
	assert.ErrorContains(t, err, "-v must not be negative")
}

// A flag the machine cannot act on is not a usage error: NUMA discovery that
// fails exits with exitFailure, a bad flag value with exitUsage.
func TestServeConfigErrorsExitCodes(t *testing.T) {
	sys := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(sys, "sys/devices/system"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(sys, "sys/devices/system/node"), nil, 0o600))
	o := &serveOptions{socketDir: t.TempDir(), controlSocket: "/c.sock", stopGracePeriod: time.Minute}
	_, err := o.config(sys)
	require.ErrorContains(t, err, "discover NUMA nodes")
	assert.Equal(t, exitFailure, exitCode(withExitCode(exitUsage, err)))

	o.stopGracePeriod = 0
	o.numaNodes = []int{0}
	_, err = o.config(sys)
	require.ErrorContains(t, err, "--stop-grace-period must be positive")
	assert.Equal(t, exitUsage, exitCode(withExitCode(exitUsage, err)))
}

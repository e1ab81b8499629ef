package main

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/openkubelet/devmgr/checkpoint"
	"github.com/openkubelet/devmgr/plugintest"
)

// inProcess is the outcome of devmgr run in the test's process.
type inProcess struct {
	code           int
	stdout, stderr string
}

// devmgr runs the root command with args, stdin as its standard input.
func devmgr(t *testing.T, stdin string, args ...string) inProcess {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := execute(context.Background(), args, strings.NewReader(stdin), &stdout, &stderr)
	return inProcess{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// Each class of failure exits with its own code, which the help lists.
func TestExitCodes(t *testing.T) {
	h := newControlHarness(t, gpus(2))
	missing := filepath.Join(h.dir, "missing.sock")

	// A checkpoint damaged on disk: one device ID changed after the
	// checksum was computed.
	blob, err := os.ReadFile(fixture("sample"))
	require.NoError(t, err)
	damaged := filepath.Join(shortTempDir(t), checkpoint.DeviceManagerKey)
	require.NoError(t, os.WriteFile(damaged, bytes.Replace(blob, []byte("dev-1"), []byte("dev-7"), 1), 0o600))

	for _, tc := range []struct {
		name   string
		stdin  string
		args   []string
		code   int
		stderr string
	}{
		{"admitted", gpuPod("ok-1", 1), []string{"admit", "--control-socket", h.sock, "-f", "-"}, exitOK, ""},
		{"released", "", []string{"release", "--control-socket", h.sock, "ok-1"}, exitOK, ""},

		{"refused: not enough devices", gpuPod("big", 3), []string{"admit", "--control-socket", h.sock, "-f", "-"}, exitRefused,
			"requested number of devices unavailable for example.com/gpu. Requested: 3, Available: 2 (409 Conflict)"},
		{"refused: not a pod", "kind: Deployment\n", []string{"admit", "--control-socket", h.sock, "-f", "-", "--json"}, exitRefused,
			"(422 Unprocessable Entity)"},
		{"corrupt checkpoint", "", []string{"checkpoint", "verify", damaged}, exitRefused,
			damaged + ": checkpoint is corrupted: expected 648430460, actual "},
		{"undecodable checkpoint", "", []string{"checkpoint", "inspect", fixture("badjson")}, exitRefused, "decode checkpoint"},

		{"not found: no such pod", "", []string{"release", "--control-socket", h.sock, "nobody"}, exitNotFound,
			`pod "nobody" is not admitted (404 Not Found)`},
		{"not found: no pod file", "", []string{"admit", "--control-socket", h.sock, "-f", filepath.Join(h.dir, "no.yaml")}, exitNotFound,
			"no such file or directory"},
		{"not found: no checkpoint", "", []string{"checkpoint", "verify", filepath.Join(h.dir, "none")}, exitNotFound,
			"checkpoint is not found"},
		{"unreachable: nothing on the socket", "", []string{"pods", "--control-socket", missing}, exitNotFound,
			"cannot reach devmgr serve on " + missing},

		{"usage: unknown command", "", []string{"statuz"}, exitUsage, `unknown command "statuz" for "devmgr"`},
		{"usage: unknown flag", "", []string{"status", "--control-socket", h.sock, "--verbose"}, exitUsage, "unknown flag: --verbose"},
		{"usage: bad flag value", "", []string{"pods", "--control-socket", h.sock, "--timeout", "soon"}, exitUsage, `invalid argument "soon"`},
		{"usage: missing argument", "", []string{"release", "--control-socket", h.sock}, exitUsage, "missing UID: usage: devmgr release [--control-socket PATH] UID"},
		{"usage: extra argument", "", []string{"version", "now"}, exitUsage, `devmgr version takes no arguments, not ["now"]: usage: devmgr version`},
		{"usage: no control socket", "", []string{"status"}, exitUsage, "no control socket: set --control-socket or $DEVMGR_CONTROL_SOCKET"},
		{"usage: serve flag check", "", []string{"serve", "--socket-dir", h.dir, "--control-socket", missing, "--log-format", "xml"}, exitUsage,
			`--log-format must be text or json, not "xml"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := devmgr(t, tc.stdin, tc.args...)
			assert.Equal(t, tc.code, res.code, "stdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
			if tc.code == exitOK {
				assert.Empty(t, res.stderr)
			} else {
				assert.True(t, strings.HasPrefix(res.stderr, "devmgr: "), res.stderr)
				assert.Contains(t, res.stderr, tc.stderr)
			}
		})
	}

	t.Run("other: a plugin call failed", func(t *testing.T) {
		h.plugin.SetError(plugintest.MethodAllocate, status.Error(codes.Internal, "device on fire"))
		defer h.plugin.SetError(plugintest.MethodAllocate, nil)
		res := devmgr(t, gpuPod("fire", 1), "admit", "--control-socket", h.sock, "-f", "-")
		assert.Equal(t, exitFailure, res.code, res.stderr)
		assert.Contains(t, res.stderr, "device on fire")
		assert.Contains(t, res.stderr, "(502 Bad Gateway)")
	})

	t.Run("other: no answer in time", func(t *testing.T) {
		// A socket that accepts and never answers: the request may have
		// been acted on, so this is not "unreachable".
		silent := filepath.Join(shortTempDir(t), "silent.sock")
		l, err := net.Listen("unix", silent)
		require.NoError(t, err)
		accepted := make(chan net.Conn, 1)
		done := make(chan struct{})
		go func() {
			defer close(done)
			if c, err := l.Accept(); err == nil {
				accepted <- c
			}
		}()
		defer func() {
			require.NoError(t, l.Close())
			<-done
			select {
			case c := <-accepted:
				require.NoError(t, c.Close())
			default:
			}
		}()
		res := devmgr(t, "", "status", "--control-socket", silent, "--timeout", "200ms")
		assert.Equal(t, exitFailure, res.code, res.stderr)
		assert.Contains(t, res.stderr, "no answer from devmgr serve on "+silent+" within 200ms")
	})

	t.Run("the help lists the codes", func(t *testing.T) {
		res := devmgr(t, "", "--help")
		require.Equal(t, exitOK, res.code)
		for _, code := range []int{exitOK, exitFailure, exitUsage, exitRefused, exitNotFound, exitNotReady} {
			assert.Regexp(t, fmt.Sprintf(`(?m)^  %d  \S`, code), res.stdout)
		}
		assert.Contains(t, res.stdout, exitCodesHelp)
	})
}

// Every command names a positional argument it does not take, with its
// usage, instead of calling it an unknown command; the commands that take
// one name it when it is missing. Nothing runs: the arguments are checked
// before the required flags and the control socket.
func TestPositionalArguments(t *testing.T) {
	root := newRootCmd()
	var leaves []*cobra.Command
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Runnable() && !c.HasSubCommands() && c.Name() != "help" {
			leaves = append(leaves, c)
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	takesOne := map[string]string{"devmgr release": "UID", "devmgr checkpoint inspect": "FILE", "devmgr checkpoint verify": "FILE"}
	for _, c := range leaves {
		path := strings.Fields(c.CommandPath())[1:]
		// Executed, every command has flags (--help at least).
		usage := strings.TrimSuffix(c.UseLine(), " [flags]")
		t.Run(c.CommandPath(), func(t *testing.T) {
			name, ok := takesOne[c.CommandPath()]
			if !ok {
				res := devmgr(t, "", append(path, "extra")...)
				assert.Equal(t, exitUsage, res.code)
				assert.Equal(t, fmt.Sprintf("devmgr: %s takes no arguments, not [\"extra\"]: usage: %s [flags]\n", c.CommandPath(), usage), res.stderr)
				return
			}
			res := devmgr(t, "", path...)
			assert.Equal(t, exitUsage, res.code)
			assert.Equal(t, fmt.Sprintf("devmgr: missing %s: usage: %s [flags]\n", name, usage), res.stderr)
			res = devmgr(t, "", append(path, "a", "b")...)
			assert.Equal(t, exitUsage, res.code)
			assert.Equal(t, fmt.Sprintf("devmgr: %s takes one %s, not 2 arguments ([\"a\" \"b\"])\n", c.CommandPath(), name), res.stderr)
		})
	}
	assert.Len(t, leaves, 11, "demo, serve, status, pods, admit, release, checkpoint inspect and verify, sanity, fake-plugin, version")
}

// The client commands take their control socket from $DEVMGR_CONTROL_SOCKET
// when --control-socket is absent; the flag wins over it.
func TestControlSocketFromEnvironment(t *testing.T) {
	h := newControlHarness(t, gpus(2))
	missing := filepath.Join(h.dir, "missing.sock")

	t.Setenv(envControlSocket, h.sock)
	res := devmgr(t, gpuPod("env-1", 1), "admit", "-f", "-")
	require.Equal(t, exitOK, res.code, res.stderr)
	res = devmgr(t, "", "pods", "--json")
	require.Equal(t, exitOK, res.code, res.stderr)
	assert.Contains(t, res.stdout, `"uid": "env-1"`, "served by the harness")

	res = devmgr(t, "", "status", "--control-socket", missing)
	assert.Equal(t, exitNotFound, res.code)
	assert.Contains(t, res.stderr, "cannot reach devmgr serve on "+missing, "the flag wins")

	t.Setenv(envControlSocket, missing)
	res = devmgr(t, "", "release", "--control-socket", h.sock, "env-1")
	assert.Equal(t, exitOK, res.code, res.stderr)
	res = devmgr(t, "", "pods")
	assert.Equal(t, exitNotFound, res.code)
	assert.Contains(t, res.stderr, "cannot reach devmgr serve on "+missing)

	t.Setenv(envControlSocket, "")
	res = devmgr(t, "", "pods")
	assert.Equal(t, exitUsage, res.code)
}

func TestVersion(t *testing.T) {
	t.Run("from the build information", func(t *testing.T) {
		var out bytes.Buffer
		require.NoError(t, writeVersion(&out, &debug.BuildInfo{
			GoVersion: "go1.26.0",
			Main:      debug.Module{Path: "github.com/openkubelet/devmgr", Version: "v1.2.3"},
			Settings: []debug.BuildSetting{
				{Key: "vcs", Value: "git"},
				{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"},
				{Key: "vcs.time", Value: "2026-11-30T10:00:00Z"},
				{Key: "vcs.modified", Value: "true"},
			},
		}))
		assert.Equal(t, `module:   github.com/openkubelet/devmgr
version:  v1.2.3
revision: 0123456789abcdef0123456789abcdef01234567
modified: true
time:     2026-11-30T10:00:00Z
go:       go1.26.0
`, out.String())
	})
	t.Run("a checkout built without VCS information", func(t *testing.T) {
		var out bytes.Buffer
		require.NoError(t, writeVersion(&out, &debug.BuildInfo{
			GoVersion: "go1.26.0",
			Main:      debug.Module{Path: "github.com/openkubelet/devmgr", Version: "(devel)"},
		}))
		assert.Equal(t, `module:   github.com/openkubelet/devmgr
version:  (devel)
revision: unknown
modified: unknown
time:     unknown
go:       go1.26.0
`, out.String())
	})
	t.Run("help suggests no go install of an unpublished module", func(t *testing.T) {
		var walk func(c *cobra.Command)
		walk = func(c *cobra.Command) {
			assert.NotContains(t, c.Long+c.Example, "@latest", "%s: the module is not published; build from the checkout", c.CommandPath())
			for _, sub := range c.Commands() {
				walk(sub)
			}
		}
		walk(newRootCmd())
	})
	t.Run("no build information", func(t *testing.T) {
		var out bytes.Buffer
		require.NoError(t, writeVersion(&out, nil))
		assert.Equal(t, "module:   unknown\nversion:  unknown\nrevision: unknown\nmodified: unknown\ntime:     unknown\ngo:       unknown\n", out.String())
	})
	t.Run("the binary reports the build information recorded in it", func(t *testing.T) {
		res := runDevmgrBinary(t, nil, "version")
		require.Equal(t, 0, res.exitCode, res.stderr)
		info, err := buildinfo.ReadFile(binary(t))
		require.NoError(t, err)
		var want bytes.Buffer
		require.NoError(t, writeVersion(&want, info))
		assert.Equal(t, want.String(), res.stdout)
		assert.Contains(t, res.stdout, "module:   github.com/openkubelet/devmgr\n")
	})
}

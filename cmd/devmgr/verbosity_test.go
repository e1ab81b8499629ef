package main

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every command takes the root's -v N, written as klog takes it, with -vv
// and -vvv short for 3 and 4, before or after the command's name; nothing
// else is a verbosity.
func TestEveryCommandTakesV(t *testing.T) {
	var leaves [][]string
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Runnable() && !c.HasSubCommands() {
			leaves = append(leaves, strings.Fields(c.CommandPath())[1:])
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRootCmd())
	require.Len(t, leaves, 11)
	for _, path := range leaves {
		t.Run(strings.Join(path, " "), func(t *testing.T) {
			for _, tc := range []struct {
				args []string
				want int
			}{
				{append(path, "-v", "4"), 4},
				{append(path, "--v=1"), 1},
				{append(path, "-v0"), 0},
				{append(path, "-vv"), 3},
				{append(path, "-vvv"), 4},
				{append([]string{"-v", "2"}, path...), 2},
				{path, -1}, // the command's default
			} {
				root := newRootCmd()
				cmd, args, err := root.Find(tc.args)
				require.NoError(t, err, tc.args)
				require.Equal(t, path[len(path)-1], cmd.Name())
				require.NoError(t, cmd.ParseFlags(args), tc.args)
				assert.Equal(t, tc.want, logVerbosity(cmd, -1), tc.args)
			}
			for _, bad := range []string{"x", "-1", "2.5", "vx"} {
				res := devmgr(t, "", append(path, "-v", bad)...)
				assert.Equal(t, exitUsage, res.code, bad)
				assert.Contains(t, res.stderr, `invalid argument "`+bad+`" for "-v, --v" flag: want a number from 0`)
			}
		})
	}
}

// At -v 4 the client commands log each call to serve and its answer on
// stderr; without -v they log nothing.
func TestClientLogsItsCallsAtV4(t *testing.T) {
	h := newControlHarness(t, gpus(2))
	res := devmgr(t, "", "status", "--control-socket", h.sock)
	require.Equal(t, exitOK, res.code, res.stderr)
	assert.Empty(t, res.stderr)

	for _, args := range [][]string{
		{"status", "--control-socket", h.sock, "-v", "4"},
		{"-v", "4", "status", "--control-socket", h.sock},
	} {
		res = devmgr(t, "", args...)
		require.Equal(t, exitOK, res.code, res.stderr)
		assert.Contains(t, res.stdout, "example.com/gpu")
		assert.Contains(t, res.stderr, `"Calling devmgr serve" method="GET" path="/v1/status" controlSocket="`+h.sock+`"`, args)
		assert.Contains(t, res.stderr, `"devmgr serve answered" status="200 OK"`, args)
	}

	res = devmgr(t, "", "release", "--control-socket", h.sock, "-v", "3", "nobody")
	assert.Equal(t, exitNotFound, res.code)
	assert.NotContains(t, res.stderr, "Calling devmgr serve", "-v 3 is below the calls' level")
}

func TestVerbosityValue(t *testing.T) {
	for in, want := range map[string]int{"0": 0, "2": 2, "10": 10, "v": 3, "vv": 4, "vvvv": 6} {
		var v verbosity
		require.NoError(t, v.Set(in), in)
		assert.Equal(t, want, int(v), in)
		assert.Equal(t, "int", v.Type())
	}
	for _, in := range []string{"", "-1", "x", "1v", "v1"} {
		var v verbosity
		assert.Error(t, v.Set(in), in)
	}
}

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/openkubelet/devmgr/testdata/demo"
)

// defaultDemoTimeout bounds the whole demo; it normally takes well under a
// second.
const defaultDemoTimeout = 30 * time.Second

func newDemoCmd() *cobra.Command {
	var (
		asJSON  bool
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "See the device manager work: plugins, pods, device health, restart (no setup)",
		Long: `Run the device manager end to end, with no setup, no root and no network.

In a temporary directory (under $TMPDIR) the demo starts a device manager and
two fake device plugins: example.com/gpu (4 GPUs on NUMA nodes 0 and 1, a
preferred-allocation policy that packs a container's GPUs on one NUMA node,
CDI device names) and example.com/nic (8 NICs, PreStartContainer required).
It then:

  1. starts the device manager;
  2. starts both plugins, which register, and shows the capacity;
  3. admits the demo pods (an init container, a sidecar, an app container
     asking for 2 GPUs, and a pod that does not fit) and shows which devices
     each container got;
  4. shows each container's run options (envs, device nodes, mounts,
     annotations, CDI devices);
  5. turns one allocated GPU unhealthy, shows the pod the manager notifies
     and its devices' health;
  6. stops the manager, starts a new one on the same directory (the plugins
     restart and register again) and compares every allocation with the one
     restored from the checkpoint;
  7. prints a summary, stops everything and removes its directory.

The pods are Kubernetes pod manifests embedded in the binary (testdata/demo).`,
		Example: `  devmgr demo                 # readable tables
  devmgr demo --json | jq .summary
  devmgr demo -v 3            # with the manager's logs on stderr (-vv for short)`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Interrupted, the demo still stops what it started and removes
			// its directory; so it does when the reader of its log goes
			// (-v 3 | head): with SIGPIPE ignored, a write to the closed pipe
			// fails instead of killing the process, and the failure ends the
			// demo.
			signal.Ignore(syscall.SIGPIPE)
			// The demo's sockets live in a new directory under $TMPDIR.
			if longest := filepath.Join(os.TempDir(), "dmdemo4294967295", "example.com-gpu.sock"); len(longest) > maxSocketPath {
				return fmt.Errorf("TMPDIR %s is too long for the demo's unix sockets (%s would be %d bytes, at most %d); "+
					"run it with a shorter one: TMPDIR=/tmp devmgr demo", os.TempDir(), longest, len(longest), maxSocketPath)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			ctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			logOut := cancelOnError{w: cmd.ErrOrStderr(), cancel: cancel}
			rep, err := runDemo(ctx, demoConfig{pods: demo.Pods, logger: demoLogger(logVerbosity(cmd, 0), logOut)})
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("demo timed out after %s (--timeout): %w", timeout, err)
			}
			if err != nil {
				return fmt.Errorf("demo failed: %w", err)
			}
			if asJSON {
				b, err := json.MarshalIndent(rep, "", "  ")
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s\n", b)
				return nil
			}
			writeDemoText(cmd.OutOrStdout(), rep)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON document instead of tables")
	cmd.Flags().DurationVar(&timeout, "timeout", defaultDemoTimeout, "give up after this long")
	return cmd
}

// cancelOnError writes to w, and calls cancel once a write fails: nobody
// reads the log any more.
type cancelOnError struct {
	w      io.Writer
	cancel context.CancelFunc
}

func (c cancelOnError) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	if err != nil {
		c.cancel()
	}
	return n, err
}

// demoLogger returns the logger of the demo's manager and plugins: silent at
// verbosity 0, so that the output stays readable, else klog text on w at
// that verbosity (devmgr logs state changes at V(2), allocation decisions
// at V(3) and RPCs at V(4)).
func demoLogger(verbosity int, w io.Writer) klog.Logger {
	if verbosity <= 0 {
		// A zero klog.Logger would mean klog.Background(), which prints.
		return logr.Discard()
	}
	return textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(verbosity), textlogger.Output(w)))
}

// Command devmgr runs the kubelet's Device Manager on its own: a demo that
// needs no setup, a standalone manager that device plugins can register with
// (a fake kubelet for plugin authors), and tools to read kubelet checkpoints.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

func main() {
	if err := newRootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "devmgr:", err)
		os.Exit(exitCode(err))
	}
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "devmgr",
		Short: "The kubelet's Device Manager, standalone",
		Long: `devmgr runs the kubelet's Device Manager on its own.

  devmgr demo                 see it work: plugins, pods, health, restart (no setup)
  devmgr serve                a standalone device manager / fake kubelet for plugin authors
  devmgr status|pods|admit|release   talk to a running "devmgr serve"
  devmgr checkpoint inspect|verify   read and check a kubelet_internal_checkpoint`,
		Example: `  # See devmgr work: two fake plugins, four pods, a health change, a restart.
  devmgr demo

  # A fake kubelet for your device plugin, and a pod admitted through it.
  devmgr serve --socket-dir /tmp/dp --control-socket /tmp/dp-ctl.sock &
  devmgr admit --control-socket /tmp/dp-ctl.sock -f pod.yaml

  # Check a node's checkpoint.
  devmgr checkpoint verify /var/lib/kubelet/device-plugins/kubelet_internal_checkpoint`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(
		newDemoCmd(),
		newServeCmd(),
		newStatusCmd(), newPodsCmd(), newAdmitCmd(), newReleaseCmd(),
		newCheckpointCmd(),
	)
	return root
}

// exitError carries a specific exit code.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func exitCode(err error) int {
	var e *exitError
	if errors.As(err, &e) {
		return e.code
	}
	return 1
}

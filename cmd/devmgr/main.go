// Command devmgr runs the kubelet's Device Manager on its own: a demo that
// needs no setup, a standalone manager that device plugins can register with
// (a fake kubelet for plugin authors), and tools to read kubelet checkpoints.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
)

func main() {
	os.Exit(execute(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// execute runs devmgr with args and returns its exit code; errors are
// printed on stderr.
func execute(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := newRootCmd()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(stderr, "devmgr:", err)
		return exitCode(err)
	}
	return exitOK
}

// Exit codes. The root command's help and docs/SERVE.md list them; a script
// tells from them what went wrong without reading the message.
const (
	exitOK = 0
	// exitFailure: any error not in a class below, such as a plugin call
	// that failed, or an answer that did not come in time.
	exitFailure = 1
	// exitUsage: the command line is wrong (unknown command or flag, a bad
	// flag value, a missing flag or argument), as by most Unix tools.
	exitUsage = 2
	// exitRefused: the input was refused, or is corrupt: serve refused the
	// admission (an invalid pod, or devices it cannot give), or a checkpoint
	// does not decode or its checksum does not match.
	exitRefused = 3
	// exitNotFound: what was named is not there: no admitted pod with that
	// UID, no such file, no devmgr serve answering on the control socket
	// (nothing was sent), or no device plugin registering with sanity or
	// within status --wait-for.
	exitNotFound = 4
	// exitNotReady: serve refused the admission because a resource's
	// device plugin is not ready yet (HTTP 503, reason PluginNotReady): a
	// transient refusal, worth retrying.
	exitNotReady = 5
)

const exitCodesHelp = `Exit codes:
  0  success
  1  any other error (a plugin call failed, no answer in time, a sanity
     check failed, ...)
  2  usage: unknown command or flag, bad flag value, missing argument
  3  refused or corrupt: serve refused the admission, or the checkpoint
     does not verify
  4  not found or unreachable: no such pod or file, nothing serves the
     control socket, or no device plugin registered (sanity, status
     --wait-for)
  5  not ready, retry: serve refused the admission because a device plugin
     has not registered again or listed its devices yet`

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "devmgr",
		Short: "The kubelet's Device Manager, standalone",
		Long: `devmgr runs the kubelet's Device Manager on its own.

  devmgr demo                 see it work: plugins, pods, health, restart (no setup)
  devmgr serve                a standalone device manager / fake kubelet for plugin authors
  devmgr status|pods|admit|release   talk to a running "devmgr serve"
  devmgr checkpoint inspect|verify   read and check a kubelet_internal_checkpoint
  devmgr sanity               check a device plugin the way the kubelet will use it
  devmgr fake-plugin          a device plugin of fake devices, to try serve and sanity with
  devmgr version              the version and VCS revision of this binary

The commands that talk to "devmgr serve" find its control socket in
--control-socket, or else in $` + envControlSocket + `. Every command takes
-v N, klog's verbosity of the logs on stderr.

` + exitCodesHelp,
		Example: `  # See devmgr work: two fake plugins, three pods, a health change, a restart.
  devmgr demo

  # A fake kubelet for your device plugin, and a pod admitted through it.
  devmgr serve --socket-dir /tmp/dp --control-socket /tmp/dp-ctl.sock &
  export ` + envControlSocket + `=/tmp/dp-ctl.sock
  devmgr admit -f pod.yaml

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
		newSanityCmd(),
		newFakePluginCmd(),
		newVersionCmd(),
	)
	addVerbosityFlag(root)
	classifyRunErrors(root)
	return root
}

// exitError carries a specific exit code.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// withExitCode gives err the exit code code, unless it already has one;
// nil stays nil.
func withExitCode(code int, err error) error {
	var e *exitError
	if err == nil || errors.As(err, &e) {
		return err
	}
	return &exitError{code: code, err: err}
}

// classifyRunErrors makes every error a command's RunE returns carry an
// exit code, exitFailure unless the command gave it another. An error
// without one is then cobra's own: a command line it could not accept.
func classifyRunErrors(cmd *cobra.Command) {
	if run := cmd.RunE; run != nil {
		cmd.RunE = func(c *cobra.Command, args []string) error {
			return withExitCode(exitFailure, run(c, args))
		}
	}
	for _, sub := range cmd.Commands() {
		classifyRunErrors(sub)
	}
}

func exitCode(err error) int {
	var e *exitError
	if errors.As(err, &e) {
		return e.code
	}
	return exitUsage
}

package main

import (
	"fmt"
	"io"
	"runtime/debug"
	"text/tabwriter"

	"github.com/spf13/cobra"
)

// unknown stands for what the binary's build information does not hold.
const unknown = "unknown"

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version and the VCS revision of this binary",
		Long: `version prints what the Go toolchain recorded in this binary: the module and
its version ("(devel)" for a binary built from a checkout rather than
installed at a released version), the VCS revision it was built from, whether
the checkout had uncommitted changes, the commit time, and the Go version.
What was not recorded (a build with -buildvcs=false, or outside a checkout)
is printed as "unknown".`,
		Example: `  devmgr version
  go build -o devmgr ./cmd/devmgr && ./devmgr version   # from a checkout: revision and modified set`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			info, ok := debug.ReadBuildInfo()
			if !ok {
				info = nil
			}
			return writeVersion(cmd.OutOrStdout(), info)
		},
	}
}

// writeVersion prints the version lines of info; nil: no build information.
func writeVersion(w io.Writer, info *debug.BuildInfo) error {
	module, version, goVersion := unknown, unknown, unknown
	revision, modified, vcsTime := unknown, unknown, unknown
	if info != nil {
		module, version, goVersion = orUnknown(info.Main.Path), orUnknown(info.Main.Version), orUnknown(info.GoVersion)
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				revision = orUnknown(s.Value)
			case "vcs.modified":
				modified = orUnknown(s.Value)
			case "vcs.time":
				vcsTime = orUnknown(s.Value)
			}
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprintf(tw, "module:\t%s\n", module)
	fmt.Fprintf(tw, "version:\t%s\n", version)
	fmt.Fprintf(tw, "revision:\t%s\n", revision)
	fmt.Fprintf(tw, "modified:\t%s\n", modified)
	fmt.Fprintf(tw, "time:\t%s\n", vcsTime)
	fmt.Fprintf(tw, "go:\t%s\n", goVersion)
	return tw.Flush()
}

func orUnknown(s string) string {
	if s == "" {
		return unknown
	}
	return s
}

package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

// oneArg accepts exactly one positional argument and names it when it is
// missing ("missing FILE") or when there are more.
func oneArg(name string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		switch {
		case len(args) == 0:
			return fmt.Errorf("missing %s: usage: %s", name, cmd.UseLine())
		case len(args) > 1:
			return fmt.Errorf("%s takes one %s, not %d arguments (%q)", cmd.CommandPath(), name, len(args), args)
		}
		return nil
	}
}

// noArgs refuses positional arguments to a command that takes none, naming
// them. cobra's own check says "unknown command", as if a subcommand had
// been meant, where a flag's name is usually what is missing
// ("devmgr status /tmp/ctl.sock").
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("%s takes no arguments, not %q: usage: %s", cmd.CommandPath(), args, cmd.UseLine())
	}
	return nil
}

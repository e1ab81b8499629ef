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

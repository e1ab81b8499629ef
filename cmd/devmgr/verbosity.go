package main

import (
	"errors"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
)

// verbosityFlag is klog's -v N, one flag on the root command that every
// command takes.
const verbosityFlag = "v"

const verbosityUsage = `log verbosity on stderr, as klog's -v: 2 registrations and state changes, ` +
	`3 allocation decisions, 4 every call (-vv and -vvv are short for -v 3 and -v 4; ` +
	`fake-plugin defaults to 2; sanity, checkpoint and version log nothing)`

// verbosity is the value of -v: a number from 0. As a shorthand the v's
// count, -vv for -v 3 and -vvv for -v 4, as demo's own flag counted them
// before every command took klog's -v N: pflag hands Set what follows the
// first v of "-vv", and "v" is no number.
type verbosity int

func (v *verbosity) String() string { return strconv.Itoa(int(*v)) }

func (v *verbosity) Type() string { return "int" }

func (v *verbosity) Set(s string) error {
	if s != "" && strings.Trim(s, "v") == "" {
		*v = verbosity(len(s) + 2)
		return nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return errors.New("want a number from 0 (-vv and -vvv are short for -v 3 and -v 4)")
	}
	*v = verbosity(n)
	return nil
}

// addVerbosityFlag gives root, and so every command, -v N.
func addVerbosityFlag(root *cobra.Command) {
	v := verbosity(0)
	root.PersistentFlags().VarP(&v, verbosityFlag, verbosityFlag, verbosityUsage)
}

// logVerbosity returns the -v the command line gave cmd, or def without one.
func logVerbosity(cmd *cobra.Command, def int) int {
	f := cmd.Flags().Lookup(verbosityFlag)
	if f == nil || !f.Changed {
		return def
	}
	if v, ok := f.Value.(*verbosity); ok {
		return int(*v)
	}
	return def
}

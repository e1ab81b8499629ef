package main

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const repoRoot = "../.."

// readmeBlocks returns the fenced code blocks of the README of one language.
func readmeBlocks(t *testing.T, lang string) [][]string {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot, "README.md"))
	require.NoError(t, err)
	defer f.Close()
	var blocks [][]string
	var cur []string
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case !in && line == "```"+lang:
			in, cur = true, nil
		case in && line == "```":
			in = false
			blocks = append(blocks, cur)
		case in:
			cur = append(cur, line)
		}
	}
	require.NoError(t, sc.Err())
	require.False(t, in, "unterminated code block")
	return blocks
}

// Every Go line of the README stands in a compiled, run Example.
func TestReadmeGoSnippetsAreExamples(t *testing.T) {
	var examples strings.Builder
	for _, f := range []string{"devicemanager/example_test.go", "plugintest/example_devmgr_test.go", "podadmit/example_test.go", "sanity/example_test.go"} {
		b, err := os.ReadFile(filepath.Join(repoRoot, f))
		require.NoError(t, err)
		examples.Write(b)
	}
	blocks := readmeBlocks(t, "go")
	require.NotEmpty(t, blocks)
	for _, block := range blocks {
		for _, line := range block {
			if l := strings.TrimSpace(line); l != "" {
				assert.Contains(t, examples.String(), l, "README Go line not in an Example")
			}
		}
	}
}

// Every devmgr command line of the README names real commands and flags; the
// ones that need nothing but the repository run and succeed.
func TestReadmeCommandLines(t *testing.T) {
	var ran, parsed int
	for _, block := range readmeBlocks(t, "sh") {
		for _, line := range block {
			if i := strings.Index(line, " #"); i >= 0 {
				line = line[:i]
			}
			fields := strings.Fields(strings.TrimSuffix(strings.TrimSpace(line), "&"))
			switch {
			case len(fields) >= 3 && fields[0] == "go" && fields[1] == "run" && fields[2] == "./cmd/devmgr":
				fields = fields[3:]
			case len(fields) > 0 && fields[0] == "devmgr":
				fields = fields[1:]
			default:
				continue
			}
			root := newRootCmd()
			cmd, args, err := root.Find(fields)
			require.NoError(t, err, line)
			require.NotEqual(t, root, cmd, "%q names no command", line)
			require.NoError(t, cmd.ParseFlags(args), line)
			parsed++
			if len(fields) > 2 && fields[0] == "checkpoint" && strings.HasPrefix(fields[len(fields)-1], "testdata/") {
				res := runDevmgrBinaryIn(t, repoRoot, nil, fields...)
				assert.Equal(t, 0, res.exitCode, "%s\n%s", line, res.stderr)
				ran++
			}
		}
	}
	assert.GreaterOrEqual(t, parsed, 8)
	assert.GreaterOrEqual(t, ran, 2)
}

// The README's table of exit codes lists the codes devmgr uses, in order.
func TestReadmeExitCodes(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	require.NoError(t, err)
	_, table, found := strings.Cut(string(b), "## Exit codes\n")
	require.True(t, found, "README.md has an exit codes section")
	var codes []string
	for _, line := range strings.Split(table, "\n") {
		if strings.HasPrefix(line, "| ") && !strings.HasPrefix(line, "| Code") {
			codes = append(codes, strings.TrimSpace(strings.Split(line, "|")[1]))
		}
		if line == "" && len(codes) > 0 {
			break
		}
	}
	var want []string
	for _, c := range []int{exitOK, exitFailure, exitUsage, exitRefused, exitNotFound, exitNotReady} {
		want = append(want, strconv.Itoa(c))
	}
	assert.Equal(t, want, codes)
}

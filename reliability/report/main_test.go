package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// git runs git in dir with a fixed identity and returns its trimmed output.
func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	args = append([]string{"-C", dir, "-c", "user.name=test", "-c", "user.email=test@example.com",
		"-c", "commit.gpgsign=false"}, args...)
	out, err := exec.Command("git", args...).CombinedOutput()
	require.NoError(t, err, "git %v: %s", args, out)
	return strings.TrimSpace(string(out))
}

// writeFile writes content to dir/name, creating its directory.
func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
	return p
}

// report runs the generator on one record of figures and returns the
// "Commit" row of the file it wrote to out.
func report(t *testing.T, out string) string {
	t.Helper()
	in := writeFile(t, t.TempDir(), "figures.jsonl",
		`{"category":"churn","cases":1,"faults":0,"kills":0,"lost":0,"doubled":0,"elapsed":"1s","when":"2026-01-02T03:04:05Z"}`+"\n")
	require.NoError(t, run(in, out, "", 0, "make reliability"))
	doc, err := os.ReadFile(out)
	require.NoError(t, err)
	for _, line := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(line, "| Commit |") {
			return line
		}
	}
	t.Fatalf("no Commit row in\n%s", doc)
	return ""
}

// The report names the commit it ran at, and says when the work tree had
// changes other than the report itself.
func TestReportNamesItsCommit(t *testing.T) {
	repo := t.TempDir()
	git(t, repo, "init", "-q")
	writeFile(t, repo, "code.go", "package code\n")
	out := writeFile(t, repo, "docs/RELIABILITY.md", "figures of an earlier run\n")
	git(t, repo, "add", ".")
	git(t, repo, "commit", "-q", "-m", "first")
	head := git(t, repo, "rev-parse", "--short", "HEAD")

	assert.Equal(t, "| Commit | `"+head+"` |", report(t, out), "a clean work tree")
	assert.Equal(t, "| Commit | `"+head+"` |", report(t, out),
		"the report the run before rewrote is not a change of the code")

	writeFile(t, repo, "code.go", "package code // changed\n")
	assert.Equal(t, "| Commit | `"+head+"` (with uncommitted changes) |", report(t, out), "a modified file")

	git(t, repo, "checkout", "-q", "--", "code.go")
	writeFile(t, repo, "new.go", "package code\n")
	assert.Equal(t, "| Commit | `"+head+"` (with uncommitted changes) |", report(t, out), "an untracked file")
}

func TestReportOutsideAGitWorkTree(t *testing.T) {
	dir := t.TempDir()
	// The test's temporary directory must not be inside a work tree itself.
	if out, err := exec.Command("git", "-C", dir, "rev-parse", "--show-toplevel").CombinedOutput(); err == nil {
		t.Fatalf("temporary directory %s is inside the git work tree %s", dir, out)
	}
	assert.Equal(t, "| Commit | unknown (not a git work tree) |", report(t, filepath.Join(dir, "RELIABILITY.md")))
}

// A detail recorded with its check shows the check; parameters are listed
// apart from the results, exactly as recorded.
func TestReportShowsChecksAndParameters(t *testing.T) {
	dir := t.TempDir()
	in := writeFile(t, dir, "figures.jsonl",
		`{"category":"plugin faults","cases":2,"faults":2,"kills":1,"lost":0,"doubled":0,`+
			`"details":{"leaked fds":0,"hangs seen":1,"note":"free text"},`+
			`"checks":{"leaked fds":"= 0","hangs seen":">= 1"},`+
			`"params":{"seed":1796164172044501123,"call deadline":"250ms"},`+
			`"elapsed":"1s","when":"2026-01-02T03:04:05Z"}`+"\n")
	out := filepath.Join(dir, "RELIABILITY.md")
	require.NoError(t, run(in, out, "", 0, "make reliability"))
	doc, err := os.ReadFile(out)
	require.NoError(t, err)
	assert.Contains(t, string(doc), "**plugin faults**\n\n"+
		"- hangs seen: 1 (asserted >= 1)\n"+
		"- leaked fds: 0 (asserted = 0)\n"+
		"- note: free text\n\n"+
		"Parameters:\n\n"+
		"- call deadline: 250ms\n"+
		"- seed: 1796164172044501123\n\n")
	assert.Contains(t, string(doc), "| [plugin faults](#plugin-faults) | 2 | 2 | 1 | 0 | 0 | 1s |")
}

// A category skipped for want of LazyFS is named as not run, in the result,
// the summary and its section, with how to run it; the run still passed.
func TestReportSaysWhatWasSkipped(t *testing.T) {
	dir := t.TempDir()
	in := writeFile(t, dir, "figures.jsonl",
		`{"category":"churn","cases":3,"lost":0,"doubled":0,"elapsed":"1s","when":"2026-01-02T03:04:05Z"}`+"\n"+
			`{"category":"power loss (LazyFS)","lost":0,"doubled":0,"elapsed":"","when":"2026-01-02T03:04:05Z","skipped":"skipped: no LazyFS; pass it"}`+"\n")
	out := filepath.Join(dir, "RELIABILITY.md")
	require.NoError(t, run(in, out, "", 0, "make reliability"))
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	doc := string(b)
	assert.Contains(t, doc, "| Result | passed: 0 allocations lost, 0 doubled; **not run**: power loss (LazyFS) (no LazyFS) |")
	assert.Contains(t, doc, "**Power loss was not tested in this run**: power loss (LazyFS). Pass a LazyFS binary to run it: `make reliability LAZYFS=PATH`.")
	assert.Contains(t, doc, "| [power loss (LazyFS)](#power-loss-lazyfs) | skipped | | | | | |")
	assert.Contains(t, doc, "Not run: no LazyFS; pass it.")
	assert.Contains(t, doc, "| [churn](#churn) | 3 |", "the categories that ran are reported as before")
}

package main

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const repoRoot = "../.."

// readmeMaxBytes bounds README.md: what devmgr is, the two commands, the
// status and links; the guides live in docs/.
const readmeMaxBytes = 8192

// The README and the guides whose examples these tests check, with the least
// each must hold so that a guide cannot lose its examples unnoticed: Go
// blocks, devmgr command lines that parse, and of those the ones that run.
var checkedDocs = []struct {
	file                  string
	goBlocks, parsed, ran int
}{
	{file: "README.md", parsed: 1},
	{file: "docs/EMBEDDING.md", goBlocks: 2},
	{file: "docs/PLUGIN-AUTHORS.md", goBlocks: 3, parsed: 1},
	{file: "docs/SERVE.md", parsed: 9, ran: 2},
}

// docBlocks returns the fenced code blocks of one language in a Markdown
// file of the repository (a path relative to its root).
func docBlocks(t *testing.T, file, lang string) [][]string {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot, filepath.FromSlash(file)))
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
	require.False(t, in, "%s: unterminated code block", file)
	return blocks
}

// Every Go line of the README and the guides stands in a compiled, run
// Example (the sanity one in a test).
func TestReadmeGoSnippetsAreExamples(t *testing.T) {
	var examples strings.Builder
	for _, f := range []string{"devicemanager/example_test.go", "plugintest/example_devmgr_test.go", "podadmit/example_test.go", "sanity/example_test.go"} {
		b, err := os.ReadFile(filepath.Join(repoRoot, f))
		require.NoError(t, err)
		examples.Write(b)
	}
	for _, doc := range checkedDocs {
		t.Run(doc.file, func(t *testing.T) {
			blocks := docBlocks(t, doc.file, "go")
			assert.GreaterOrEqual(t, len(blocks), doc.goBlocks, "Go blocks")
			for _, block := range blocks {
				for _, line := range block {
					if l := strings.TrimSpace(line); l != "" && !strings.Contains(examples.String(), l) {
						t.Errorf("%s: Go line not in an Example: %s", doc.file, l)
					}
				}
			}
		})
	}
}

// shellLines returns the lines of sh blocks, a line continued with a
// trailing backslash joined to the next, comments cut.
func shellLines(t *testing.T, file string) []string {
	t.Helper()
	var lines []string
	for _, block := range docBlocks(t, file, "sh") {
		cont := ""
		for _, line := range block {
			if i := strings.Index(line, " #"); i >= 0 {
				line = line[:i]
			}
			if strings.HasPrefix(strings.TrimSpace(line), "#") {
				continue
			}
			line = cont + line
			if s, ok := strings.CutSuffix(strings.TrimRight(line, " "), `\`); ok {
				cont = s + " "
				continue
			}
			cont = ""
			lines = append(lines, line)
		}
		require.Empty(t, cont, "%s: a sh block ends in a continued line", file)
	}
	return lines
}

// Every devmgr command line of the README and the guides names real commands
// and flags; the ones that need nothing but the repository run and succeed.
func TestReadmeCommandLines(t *testing.T) {
	for _, doc := range checkedDocs {
		t.Run(doc.file, func(t *testing.T) {
			var ran, parsed int
			for _, line := range shellLines(t, doc.file) {
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
			assert.GreaterOrEqual(t, parsed, doc.parsed, "command lines that parse")
			assert.GreaterOrEqual(t, ran, doc.ran, "command lines run")
		})
	}
}

// quickStart returns the sh block of the quick start in docs/SERVE.md.
func quickStart(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "docs", "SERVE.md"))
	require.NoError(t, err)
	_, section, found := strings.Cut(string(b), "\n## Quick start\n")
	require.True(t, found, "docs/SERVE.md has a quick start section")
	section, _, _ = strings.Cut(section, "\n## ")
	_, block, found := strings.Cut(section, "\n```sh\n")
	require.True(t, found, "the quick start has a sh block")
	block, _, found = strings.Cut(block, "\n```\n")
	require.True(t, found, "the quick start's block ends")
	return block
}

// The quick start runs as written, in bash from the repository's root with
// the package's devmgr binary on the PATH: serve, fake-plugin, status,
// admit, pods and sanity, each command succeeding (bash -e), and it leaves
// nothing behind.
func TestQuickStart(t *testing.T) {
	script := quickStart(t)
	for _, cmd := range []string{"serve", "fake-plugin", "status", "admit", "pods", "sanity"} {
		assert.Regexp(t, `(?m)^devmgr `+cmd+`\b`, script)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := exec.CommandContext(ctx, "bash", "-e", "-c", script)
	c.Dir = repoRoot
	c.Env = append(os.Environ(), "PATH="+filepath.Dir(binary(t))+string(os.PathListSeparator)+os.Getenv("PATH"))
	// The background jobs share bash's process group: on a timeout, or a
	// failure that left them running, they all go.
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	c.Cancel = func() error { return syscall.Kill(-c.Process.Pid, syscall.SIGKILL) }
	c.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	c.Stdout, c.Stderr = &stdout, &stderr
	err := c.Run()
	if c.Process != nil {
		_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
	}
	out := stdout.String()
	dir := regexp.MustCompile(`(?m)^Socket directory: (/tmp/devmgr\.\w+)/dp$`).FindStringSubmatch(out)
	if dir != nil {
		t.Cleanup(func() { _ = os.RemoveAll(dir[1]) })
	}
	require.NoError(t, err, "stdout:\n%s\nstderr:\n%s", out, stderr.String())

	require.NotNil(t, dir, "status names the socket directory:\n%s", out)
	assert.NoDirExists(t, dir[1], "the quick start removes its directory")
	for _, want := range []string{
		`(?m)^example\.com/gpu +4 +4 +0 +4 *$`,                                  // status: the fake plugin's 4 GPUs
		`(?m)^Pod ml/training admitted \(uid training-1\)\.$`,                   // admit
		`(?m)^training-1 +ml/training +train +example\.com/gpu +gpu-\d,gpu-\d$`, // pods
		`(?m)^20 passed, 0 failed, 1 skipped$`,                                  // sanity
	} {
		assert.Regexp(t, want, out)
	}
}

// The table of exit codes in docs/SERVE.md lists the codes devmgr uses, in
// order.
func TestReadmeExitCodes(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "docs", "SERVE.md"))
	require.NoError(t, err)
	_, table, found := strings.Cut(string(b), "## Exit codes\n")
	require.True(t, found, "docs/SERVE.md has an exit codes section")
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

// The README stays short, and keeps its first lines: the two commands.
func TestReadmeSize(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	require.NoError(t, err)
	assert.LessOrEqual(t, len(b), readmeMaxBytes, "README.md in bytes; move a guide to docs/")
	assert.True(t, strings.HasPrefix(string(b), "# devmgr\n\n```sh\ngo run ./cmd/devmgr demo "), "README.md starts with the demo command")
}

var (
	mdLink    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	mdHeading = regexp.MustCompile(`^#{1,6} (.+)$`)
)

// mdDoc is what the link check needs of a Markdown file: its relative links
// (outside code blocks) and the anchors of its headings, as GitHub makes them.
type mdDoc struct {
	links   []string
	anchors map[string]bool
}

func readMarkdown(t *testing.T, file string) mdDoc {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, filepath.FromSlash(file)))
	require.NoError(t, err)
	doc := mdDoc{anchors: map[string]bool{}}
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "```") {
			in = !in
			continue
		}
		if in {
			continue
		}
		if m := mdHeading.FindStringSubmatch(line); m != nil {
			doc.anchors[githubAnchor(m[1])] = true
		}
		for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
			if !strings.Contains(m[1], "://") && !strings.HasPrefix(m[1], "mailto:") {
				doc.links = append(doc.links, m[1])
			}
		}
	}
	return doc
}

// githubAnchor is the fragment GitHub gives a heading: lower case, spaces
// to hyphens, punctuation but hyphens and underscores dropped.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}

// Every relative link of the README and of the Markdown files it reaches
// resolves, to a file and, with a fragment, to a heading of it; the README
// reaches every guide, and every make target with a help line in the
// Makefile is named in a file it reaches.
func TestReadmeLinksResolve(t *testing.T) {
	reached := map[string]mdDoc{}
	queue := []string{"README.md"}
	for len(queue) > 0 {
		file := queue[0]
		queue = queue[1:]
		if _, ok := reached[file]; ok {
			continue
		}
		doc := readMarkdown(t, file)
		reached[file] = doc
		for _, link := range doc.links {
			target, frag, _ := strings.Cut(link, "#")
			if target == "" {
				target = file
			} else {
				target = path.Join(path.Dir(file), target)
			}
			if !assert.False(t, strings.HasPrefix(target, "../"), "%s: %s leaves the repository", file, link) {
				continue
			}
			_, err := os.Stat(filepath.Join(repoRoot, filepath.FromSlash(target)))
			if !assert.NoError(t, err, "%s: link %s", file, link) || !strings.HasSuffix(target, ".md") {
				continue
			}
			if frag != "" {
				assert.True(t, readMarkdown(t, target).anchors[frag], "%s: link %s: no such heading in %s", file, link, target)
			}
			queue = append(queue, target)
		}
	}
	for _, doc := range checkedDocs {
		assert.Contains(t, reached, doc.file, "the README does not reach %s", doc.file)
	}
	assert.Contains(t, reached, "docs/DEVELOPMENT.md")

	makefile, err := os.ReadFile(filepath.Join(repoRoot, "Makefile"))
	require.NoError(t, err)
	var text strings.Builder
	for file := range reached {
		b, err := os.ReadFile(filepath.Join(repoRoot, filepath.FromSlash(file)))
		require.NoError(t, err)
		text.Write(b)
	}
	targets := regexp.MustCompile(`(?m)^## ([a-z0-9-]+):`).FindAllStringSubmatch(string(makefile), -1)
	require.NotEmpty(t, targets)
	for _, m := range targets {
		named := regexp.MustCompile("`make " + regexp.QuoteMeta(m[1]) + "[` ]").MatchString(text.String())
		assert.True(t, named, "make %s is named nowhere the README reaches", m[1])
	}
}

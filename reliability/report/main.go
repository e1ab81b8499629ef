// Command report turns the figures of a run of devmgr's reliability suite
// (the JSON lines the tests append to their -report file) into
// docs/RELIABILITY.md. `make reliability` runs it after the suite:
//
//	go run ./reliability/report -in .cache/reliability.jsonl -log .cache/reliability.log \
//		-status 0 -cmd 'make reliability' -out docs/RELIABILITY.md
//
// It renders every category found in the input, in the order the tests
// reported them, whoever wrote the test: one row per record, its details
// below. The file names the commit the suite ran at (git's short hash of
// HEAD, marked when the work tree has uncommitted changes), so a reader can
// tell which code the figures describe. A record's details may carry "case" (the row's name) and "about"
// (a sentence on what the case does); its checks say what the test asserted
// of a detail, shown next to it, and its params, the settings of the run,
// are listed apart from the results. Most categories have their
// description here.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// figures is one JSON line of the suite (reliability.Figures).
type figures struct {
	Category string            `json:"category"`
	Cases    int               `json:"cases"`
	Faults   int               `json:"faults"`
	Kills    int               `json:"kills"`
	Lost     int               `json:"lost"`
	Doubled  int               `json:"doubled"`
	Raw      map[string]any    `json:"details"`
	Checks   map[string]string `json:"checks"`
	Params   map[string]any    `json:"params"`
	Elapsed  string            `json:"elapsed"`
	When     time.Time         `json:"when"`
	Skipped  string            `json:"skipped"`
}

func main() {
	in := flag.String("in", "", "the suite's -report file (JSON lines)")
	out := flag.String("out", "docs/RELIABILITY.md", "the Markdown file to write")
	logFile := flag.String("log", "", "the suite's go test -v output, to name failed tests (optional)")
	status := flag.Int("status", 0, "the exit status of the suite's go test run")
	command := flag.String("cmd", "make reliability", "the command that ran the suite, as shown")
	flag.Parse()
	if err := run(*in, *out, *logFile, *status, *command); err != nil {
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(1)
	}
}

func run(in, out, logFile string, status int, command string) error {
	if in == "" {
		return errors.New("-in is required")
	}
	records, err := readFigures(in)
	if err != nil {
		return err
	}
	if len(records) == 0 {
		return fmt.Errorf("%s holds no figures: did the suite run?", in)
	}
	var failed []string
	if logFile != "" {
		if failed, err = failedTests(logFile); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	info := runInfo{status: status, failed: failed, command: command, machine: machine(), commit: commitOf(out)}
	return os.WriteFile(out, render(records, info), 0o644)
}

func readFigures(path string) ([]figures, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []figures
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.UseNumber() // seeds and counts stay exact
		var r figures
		if err := dec.Decode(&r); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		out = append(out, r)
	}
	return out, sc.Err()
}

// failedTests returns the top-level tests go test -v reported as failed.
func failedTests(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "--- FAIL: "); ok {
			name, _, _ := strings.Cut(rest, " ")
			if !strings.Contains(name, "/") {
				out = append(out, name)
			}
		}
	}
	return out, nil
}

type runInfo struct {
	status  int
	failed  []string
	command string
	machine string
	commit  string
}

// commitOf names the commit of the git work tree that holds out: the short
// hash of HEAD, followed by "(with uncommitted changes)" when git status
// reports any change (untracked files included) other than out itself, which
// an earlier run may have rewritten. Outside a work tree, or without git, it
// says the commit is unknown.
func commitOf(out string) string {
	abs, err := filepath.Abs(out)
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	dir := filepath.Dir(abs)
	head, err := exec.Command("git", "-C", dir, "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown (not a git work tree)"
	}
	commit := "`" + strings.TrimSpace(string(head)) + "`"
	changes, err := exec.Command("git", "-C", dir, "status", "--porcelain", "--", ":(exclude)"+abs).Output()
	switch {
	case err != nil:
		return commit + " (git status failed: " + err.Error() + ")"
	case len(bytes.TrimSpace(changes)) > 0:
		return commit + " (with uncommitted changes)"
	}
	return commit
}

// about describes the categories whose tests this generator's authors wrote;
// other categories are described by their records' "about" detail.
var about = map[string]string{
	"bad registrations": `Every malformed RegisterRequest (a version other than v1beta1, an
invalid resource name, an endpoint that is not a bare file name or names no device plugin)
must be refused with the error the test expects, before the manager dials anything back for a
bad string; between two of them a good plugin registers again and a pod is admitted. A refusal
is counted when the client got that error. Then one plugin registers the same resource 1,000
times, paced at 1,000 per second, while a good plugin admits pods: every request must be
answered (accepted, replacing the previous connection, or refused with an error naming the
socket), and the good plugin must be served meanwhile. Faults are the refusals and answers the
client saw. The rate the loop achieves depends on the machine and its load: it is in the
test's log, not here.`,
	"churn": `-cycles times, a plugin process (the test binary, re-executed) starts,
registers, serves an admission, registers again, and is killed with SIGKILL; the manager runs
throughout. A kill is counted when the process's exit status says SIGKILL and the manager has
seen the plugin go (its devices no longer allocatable); every cycle must end so. Every pod
still active keeps its devices. Goroutines and file descriptors are counted against a baseline
taken after one warm-up cycle: while a plugin serves they must be above it (so the counts see
what a plugin holds), and after the cycles none may be left beyond it.`,
	"plugin faults": `Each case injects one fault (one case two) into a plugin registered
beside a well-behaved one: the plugin process killed in the middle of each RPC, a hang in each
RPC, or a malformed answer. A fault is counted where the test sees it: a death by the plugin
process's exit by SIGKILL (its process state); a hang by the call's DeadlineExceeded or
Canceled (the error returned, or the manager's rpc error metric), or a call still in flight
while the manager serves the rest; a malformed answer by the manager's refusal (the error
returned, logged, or counted in the metric) or by the documented reading the case asserts.
Each case must see exactly the faults it injects. The well-behaved plugin must keep being
served, and no goroutine or file descriptor may outlive a case.`,
	"load": `8 goroutines admit and release pods of one or two devices of two resources,
-admissions in all, while both plugins flip the health of their devices. Each admission must
end admitted, or refused because the devices are taken or unhealthy. A shared map of claims
finds a device given to two containers (doubled) and a pod whose devices changed before its
release (lost); at the end the checkpoint must hold exactly the ledger. Faults are the health
changes the manager received (ListAndWatch messages, counted by its metric), which must be
every flip the plugins sent.`,
	"crash consistency": `A child process (the test binary, re-executed) runs a ManagerImpl and a
plugintest plugin serving 16 devices in a directory that outlives it. It admits pods of one or
two devices, releases some (drops them from its active pods), and prints each admission once
Allocate has returned nil, when the checkpoint is on disk, before it begins the next one. The
parent kills it with SIGKILL at a random moment: a timer, up to 50 ms after the child is ready,
or (one run in eight) during its start-up, while it restores the checkpoint and its plugin
registers. The child writes its lines to a file, not a pipe: each line into a pipe would wake
the parent, whose Go timers would then fire just after the child's lines instead of at random
points of its work. After each kill the parent decodes and verifies the checkpoint (package
checkpoint), requires its allocations to be exactly the acknowledged ones, or those plus the
admission in flight, with no device in two pods, and starts a new manager on the directory,
which must restore them (GetDevices). The next child starts on the same directory, so the
checkpoint accumulates across kills.

**What "acknowledged" means for a release.** Garbage collection does not write the checkpoint,
in devmgr as in the kubelet (docs/ARCHITECTURE.md): a released pod leaves the file only with
the next admission's write, which garbage-collects first. So after a kill the file may still
hold pods released since the last acknowledged admission: exactly those, with their devices,
or, if the admission in flight was written, none of them. The test models this: a release is
acknowledged by the next acknowledged admission, and a released pod that is still in the file
is neither lost nor unexpected. Two other writes can carry a garbage collection, because a
device update writes the ledger as it is. A child starts with the pods that are acknowledged
and not released, and its Start releases the others before it returns; the plugin then sends
one device list, whose write may land before the first acknowledged admission of the run: the
file then holds the acknowledged pods without those released before the child began. That
write may also land between the first admission's garbage collection and its record: the file
then holds the acknowledged pods without any released one, and not the pod in flight. The test
allows these states until the first acknowledged admission of a run.

**Temporary files.** They are counted right after each kill, before anything else touches the
directory. A kill interrupts at most one write, so at most one may be there, and the next Start
must remove it; both are asserted.

**What SIGKILL does not test.** It ends the process, not the machine: the page cache survives.
The test shows that the checkpoint is replaced atomically (temporary file, rename) and is on
disk before Allocate returns. Whether it survives a power cut, which is what the store's fsync
of the file and of the directory are for, is the subject of the power loss category.`,
	"power loss (LazyFS)": `The crash consistency test again, with the checkpoint directory on LazyFS,
a FUSE file system that keeps written data in its own memory until the file is fsynced. After
each SIGKILL the parent tells LazyFS to drop that memory: every byte the child wrote and did not
sync is lost, as in a power cut. A loss is counted only when LazyFS has reported it done, and
only then does the parent look. The checks are those of crash consistency, the counts of
temporary files are taken after the kill and again after the loss, and the figures come from
the same kinds of kills. A checkpoint renamed into place before its data was synced reads empty
or short after the loss, and fails the test as a checkpoint that does not verify. Before the
first kill the test shows that the mount does lose data: a file written and renamed without a
sync must read empty after a loss, and a synced one must read whole. The sockets stay off the
mount; only the checkpoint directory is on it.

**What it does not model.** LazyFS passes creations, renames and removals to the disk below at
once, so a missing fsync of the directory after a rename would go unnoticed (the store does
sync it). It does not tear a write inside a file, does not lose data a disk claimed to have
flushed, and has no journal to replay: it shows what is lost when unsynced data is, nothing
about the file system below.`,
	"devmgr serve: SIGKILL": `The same question asked of the devmgr binary, as an operator runs it. The
binary is built once per run; a plugintest plugin of 16 devices, in the test process, registers
with it. The test admits pods of one or two devices and releases some through the control API,
one request at a time, and kills serve with SIGKILL at a random moment: up to 100 ms after the
plugin registered or, one run in eight, during serve's start-up. It starts serve again on the
same directories and, as soon as the control socket answers, requires that GET /v1/status
counts as allocated exactly the devices the pods of GET /v1/pods hold; that every acknowledged
admission not released since is listed and is in the checkpoint, with its devices; that no
acknowledged release is listed; that no device is held by two pods, in the list or in the
checkpoint; and that serve's start left no temporary file. The request in flight at the kill
may have landed or not; the list says which, and the test goes on from there. Serve writes two
files, the checkpoint and its file of admitted pods, each atomically and each by its own
writer: a device update's checkpoint write can run beside a release's write of the pod file,
so a kill may leave one temporary file of each, never two of one; both are asserted.`,
	"devmgr serve: power loss (LazyFS)": `devmgr serve: SIGKILL again, with serve's checkpoint directory
(the checkpoint and the file of admitted pods) on LazyFS and a power loss after every kill, as
in the power loss category, whose limits apply here too. The socket directory and the control
socket stay off the mount.`,
	"checkpoint damage": `A damaged checkpoint must never make Start fail. A checkpoint that does
not decode and verify is moved aside as kubelet_internal_checkpoint.bad-<unix time>, byte for
byte, and the manager starts with no allocations. Damage can leave a file that still decodes
and verifies, without a checksum collision, when the decoder ignores it: JSON field names match
case-insensitively, as in the kubelet. The manager must then hold exactly the decoded content,
and the test asserts that. The cases: every truncation of a devmgr checkpoint of several pods
and of the kubelet's own fixture; random bit flips in both; an empty file; a directory in the
checkpoint's place; two damaged checkpoints in one second. Then writes that fail for real,
each in a child process: a read-only bind mount and a full tmpfs in a private mount namespace
(unshare -m; as root, file modes do not stop writes), and a file size limit (RLIMIT_FSIZE). A
failed write must fail the admission that needed it (Allocate returns the error, with its
cause), leave the previous file byte for byte and the ledger without that admission, and leave
no temporary file. A restart while writes fail must restore the file, and admissions must work
again once writes do. A corrupt checkpoint in a read-only directory cannot be moved aside: Start
must still succeed, with no allocations. A fault is counted when its outcome is seen: the
damaged file moved aside byte for byte, or decoded and held exactly; a failed write when the
admission's error carries its cause (errno); a corrupt file in a read-only directory when Start
succeeded without it and left it as it was.`,
	"permissions": `Start creates the socket directory, the checkpoint directory and their
missing parents with mode 0750 minus the umask. The checkpoint is written with mode 0600.
kubelet.sock and the podresources socket must have mode 0660 exactly: whoever can connect to
kubelet.sock can register a device plugin, and so put device nodes and mounts into pods'
containers, and the podresources socket tells which devices every pod holds. A socket file gets
the socket's own mode minus the umask when it is bound, so devmgr sets the socket's mode to 0660
before bind, gives back through a descriptor of the file any bit the umask took, and listens
only then: the socket never exists at a wider mode, and no chmod follows a path. The test runs
a manager and a podresources server under the umasks 0022, 0000 and 0077, each in a child
process since the umask is the whole process's, and asserts every mode it reports.
A socket or checkpoint directory that already exists keeps its mode (Start only creates
missing ones, as the kubelet does; not tested here).`,
}

func render(records []figures, info runInfo) []byte {
	var b bytes.Buffer
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }

	var order []string
	byCat := map[string][]figures{}
	for _, r := range records {
		if _, ok := byCat[r.Category]; !ok {
			order = append(order, r.Category)
		}
		byCat[r.Category] = append(byCat[r.Category], r)
	}
	var when time.Time
	var lost, doubled int
	var skipped []string
	for _, r := range records {
		if r.Skipped != "" {
			skipped = append(skipped, r.Category)
		}
		if r.When.After(when) {
			when = r.When
		}
		lost += r.Lost
		doubled += r.Doubled
	}

	p("# Reliability\n\n")
	p("<!-- Generated by `make reliability` (reliability/report) from the figures of the suite's last run. Do not edit. -->\n\n")
	p("devmgr's reliability suite (package `reliability`, build tag `reliability`) kills, starves and\n")
	p("damages a running device manager and counts what it loses. Every category asserts that no\n")
	p("allocation is lost and that no device is given to two containers. Lost and doubled must be 0.\n")
	p("Every figure is asserted by the test that produces it; where the test records its check, the\n")
	p("check follows the figure, as in \"(asserted = 52)\". Faults and kills are counted as the test saw\n")
	p("them happen (a process's exit by signal, an error returned, a file moved aside), not from the\n")
	p("cases it defines. Parameters are settings of the run, not results, and the Time column is how\n")
	p("long a test ran, for context. This file holds the figures of the last run. CI runs the suite\n")
	p("with the default counts; the flags raise them.\n\n")

	p("## Last run\n\n")
	p("| | |\n|---|---|\n")
	p("| Command | `%s` |\n", info.command)
	p("| Commit | %s |\n", info.commit)
	p("| Date | %s |\n", when.UTC().Format("2006-01-02 15:04 MST"))
	p("| Machine | %s |\n", info.machine)
	switch {
	case info.status != 0:
		msg := fmt.Sprintf("**FAILED** (go test exit status %d)", info.status)
		if len(info.failed) > 0 {
			msg += ": " + strings.Join(quoteAll(info.failed), ", ")
		}
		p("| Result | %s; %d allocations lost, %d doubled |\n", msg, lost, doubled)
	case lost+doubled > 0:
		p("| Result | **FAILED**: %d allocations lost, %d doubled |\n", lost, doubled)
	case len(skipped) > 0:
		p("| Result | passed: 0 allocations lost, 0 doubled; **not run**: %s (no LazyFS) |\n", strings.Join(skipped, ", "))
	default:
		p("| Result | passed: 0 allocations lost, 0 doubled |\n")
	}
	p("\n")
	if len(skipped) > 0 {
		p("**Power loss was not tested in this run**: %s. Pass a LazyFS binary to run it: `make reliability LAZYFS=PATH`.\n\n",
			strings.Join(skipped, " and "))
	}

	p("## Summary\n\n")
	p("| Category | Cases tried | Faults injected | Kills survived | Lost | Doubled | Time |\n")
	p("|---|---:|---:|---:|---:|---:|---:|\n")
	for _, cat := range order {
		if rs := byCat[cat]; rs[0].Skipped != "" {
			p("| [%s](#%s) | skipped | | | | | |\n", cat, anchor(cat))
			continue
		}
		var s figures
		var elapsed time.Duration
		for _, r := range byCat[cat] {
			s.Cases += r.Cases
			s.Faults += r.Faults
			s.Kills += r.Kills
			s.Lost += r.Lost
			s.Doubled += r.Doubled
			d, _ := time.ParseDuration(r.Elapsed)
			elapsed += d
		}
		p("| [%s](#%s) | %d | %d | %d | %s | %s | %s |\n", cat, anchor(cat), s.Cases, s.Faults, s.Kills,
			flag0(s.Lost), flag0(s.Doubled), elapsed.Round(time.Millisecond))
	}
	p("\n")

	for _, cat := range order {
		rs := byCat[cat]
		p("## %s\n\n", cat)
		if text, ok := about[cat]; ok {
			p("%s\n\n", text)
		}
		if rs[0].Skipped != "" {
			p("Not run: %s.\n\n", strings.TrimPrefix(rs[0].Skipped, "skipped: "))
			continue
		}
		p("| Case | Cases tried | Faults injected | Kills survived | Lost | Doubled | Time |\n")
		p("|---|---:|---:|---:|---:|---:|---:|\n")
		for i, r := range rs {
			p("| %s | %d | %d | %d | %s | %s | %s |\n", cell(caseName(r, i, len(rs))), r.Cases, r.Faults, r.Kills,
				flag0(r.Lost), flag0(r.Doubled), r.Elapsed)
		}
		p("\n")
		for i, r := range rs {
			keys := detailKeys(r)
			if len(keys) == 0 && len(r.Params) == 0 && r.Raw["about"] == nil {
				continue
			}
			p("**%s**", caseName(r, i, len(rs)))
			if a, ok := r.Raw["about"].(string); ok {
				p(": %s", a)
			}
			p("\n\n")
			for _, k := range keys {
				p("- %s: %s", k, value(r.Raw[k]))
				if c, ok := r.Checks[k]; ok {
					p(" (asserted %s)", c)
				}
				p("\n")
			}
			if len(keys) > 0 {
				p("\n")
			}
			if len(r.Params) > 0 {
				p("Parameters:\n\n")
				for _, k := range slices.Sorted(maps.Keys(r.Params)) {
					p("- %s: %s\n", k, value(r.Params[k]))
				}
				p("\n")
			}
		}
	}

	p("## How to reproduce\n\n")
	p("```sh\n")
	p("make reliability LAZYFS=PATH                            # the default counts, as CI runs them\n")
	p("make reliability LAZYFS=PATH RELIABILITY_FLAGS=\"-kills 2000 -losses 1000\"   # larger counts\n")
	p("go test -tags reliability -count=1 -v -run TestCrashConsistency ./reliability/ -args -kills 500\n")
	p("go test -tags reliability -count=1 -v -run 'Power|Serve' ./reliability/ -args -lazyfs PATH -losses 500\n")
	p("go test -race -tags reliability -count=1 ./reliability/ -args -kills 20 -flips 200 -cycles 10 -admissions 1000 \\\n")
	p("    -losses 20 -serve-kills 20 -lazyfs PATH\n")
	p("```\n\n")
	p("Flags (after `-args`): `-kills` (SIGKILLs of the admitting child), `-losses` (the same, each\n")
	p("followed by a power loss), `-serve-kills` (SIGKILLs of `devmgr serve`, and as many with a power\n")
	p("loss), `-lazyfs` (the LazyFS binary the power-loss tests mount; `make reliability LAZYFS=PATH`\n")
	p("passes it, CI builds it; without it those tests are skipped, or fail with `-require-lazyfs`,\n")
	p("which `RELIABILITY_REQUIRE_LAZYFS=1` sets and CI uses), `-cycles` (churn cycles),\n")
	p("`-admissions` (load), `-flips` (bit flips), `-report` (append the figures as JSON lines;\n")
	p("`make reliability` writes them to `.cache/reliability/figures.jsonl`, and this file from them).\n")
	p("Random choices are logged with their seed; `DEVMGR_RELIABILITY_SEED=<seed>` repeats them.\n")
	p("The read-only bind mount and the full tmpfs need root and `unshare -m`; without them the test\n")
	p("says so in its log and in this file, and a file size limit still makes writes fail. Without\n")
	p("root, a directory's mode makes it read-only instead.\n")
	return b.Bytes()
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = "`" + s + "`"
	}
	return out
}

// caseName is a record's "case" detail, or a number when its category has
// several records without one.
func caseName(r figures, i, n int) string {
	if c, ok := r.Raw["case"].(string); ok && c != "" {
		return c
	}
	if n == 1 {
		return r.Category
	}
	return r.Category + " #" + strconv.Itoa(i+1)
}

func detailKeys(r figures) []string {
	var keys []string
	for k := range r.Raw {
		if k != "case" && k != "about" {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

func value(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case json.Number:
		return v.String()
	default:
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Sprint(v)
		}
		return "`" + string(b) + "`"
	}
}

// flag0 shows a count that must be zero, in bold when it is not.
func flag0(n int) string {
	if n != 0 {
		return "**" + strconv.Itoa(n) + "**"
	}
	return "0"
}

func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// anchor is GitHub's heading anchor for a heading made of s.
func anchor(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

// machine describes the machine the report is made on (the suite's).
func machine() string {
	parts := []string{fmt.Sprintf("%s/%s, %d CPUs", runtime.GOOS, runtime.GOARCH, runtime.NumCPU())}
	if cpu := procField("/proc/cpuinfo", "model name"); cpu != "" {
		parts[0] += " (" + cpu + ")"
	}
	if mem := procField("/proc/meminfo", "MemTotal"); mem != "" {
		if kb, err := strconv.ParseFloat(strings.TrimSuffix(mem, " kB"), 64); err == nil {
			parts = append(parts, fmt.Sprintf("%.1f GiB", kb/(1<<20)))
		}
	}
	if rel, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		parts = append(parts, "Linux "+strings.TrimSpace(string(rel)))
	}
	parts = append(parts, runtime.Version())
	if os.Geteuid() == 0 {
		parts = append(parts, "root")
	} else {
		parts = append(parts, "not root")
	}
	return strings.Join(parts, ", ")
}

// procField returns the value of the first "key: value" line of a /proc file.
func procField(path, key string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

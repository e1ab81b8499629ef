package main

import (
	"bufio"
	"bytes"
	"context"
	"debug/buildinfo"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// job is one workload variant; each run of it is a fresh process per
// implementation.
type job struct {
	workload, variant string
	args              []string
}

func (j job) name() string {
	if j.variant == "" {
		return j.workload
	}
	return j.workload + "/" + j.variant
}

var jobs = []job{
	{"W1", "n=8", []string{"-n", "8"}},
	{"W1", "n=1000", []string{"-n", "1000"}},
	{"W1", "n=10000", []string{"-n", "10000"}},
	{"W1", "n=100000", []string{"-n", "100000"}},
	{"W2", "", nil},
	{"W3", "pods=0", []string{"-pods", "0"}},
	{"W3", "pods=1000", []string{"-pods", "1000"}},
	{"W3direct", "pods=0", []string{"-pods", "0"}},
	{"W3direct", "pods=1000", []string{"-pods", "1000"}},
	{"W3", "pods=0,alternating", []string{"-pods", "0", "-states", statesAlternating}},
	{"W3direct", "pods=0,alternating", []string{"-pods", "0", "-states", statesAlternating}},
	{"W4", "", nil},
	{"W5", "g=1", []string{"-goroutines", "1"}},
	{"W5", "g=2", []string{"-goroutines", "2"}},
	{"W6", "", nil},
}

// nsScript runs in a private mount namespace (unshare -m --propagation
// private) as `sh -c nsScript bench-ns SRC PROGRAM ARGS...`. The kubelet's
// device manager only uses /var/lib/kubelet/device-plugins; there, and only
// in this namespace, SRC (a directory on the same disk as devmgr's) is
// bind-mounted. /var/lib/kubelet (or /var/lib when the host has no
// /var/lib/kubelet) is covered by a tmpfs first, so creating the mount point
// writes nothing on the host. The namespace, and its mounts, end with the
// process.
const nsScript = `set -eu
src=$1; shift
if [ -e /var/lib/kubelet ]; then top=/var/lib/kubelet; else top=/var/lib; fi
mount -t tmpfs -o mode=0755,size=16m devmgr-bench "$top"
mkdir -p /var/lib/kubelet/device-plugins
mount --bind "$src" /var/lib/kubelet/device-plugins
exec "$@"
`

type driver struct {
	// self is this program, which links both implementations. bins runs
	// each side ("devmgr" also runs the floors): self, or with -split the
	// builds of buildSides.
	self    string
	bins    map[string]string
	base    string
	impls   []string
	timeout time.Duration
	// loads is the 1-minute load average when each run started.
	loads []float64
	// common are flags given to every run.
	common []string
	// results by job name, then implementation ("disk" for the floor).
	results map[string]map[string][]result
	prep    map[string]result
}

func compareMain(args []string) error {
	fs := flag.NewFlagSet("compare", flag.ContinueOnError)
	runs := fs.Int("runs", 5, "fresh-process runs of each workload and implementation")
	out := fs.String("out", "", "write the report (markdown) to this file")
	workdir := fs.String("workdir", "/var/tmp", "parent of the run directories; on disk, not tmpfs, and not under /var/lib")
	implList := fs.String("impls", "devmgr,kubelet", "implementations to run")
	only := fs.String("only", "", "run only the workloads whose name (W1/n=8, W2, ...) matches this regexp")
	timeout := fs.Duration("timeout", 15*time.Minute, "limit of one run")
	poll := fs.Duration("poll", pollInterval, "pause between polls of GetCapacity or the checkpoint in the runs (0: a tight loop)")
	pin := fs.Bool("pin", pinPoller, "in the runs, pin the poller's thread to the last CPU and every other thread to the others while it polls")
	rev := fs.String("rev", "", "how to name the devmgr under test in the report (default: git describe of ..)")
	split := fs.Bool("split", false, "run each side in a build of bench/ that links its implementation only (-tags devmgronly, kubeletonly), instead of this binary")
	goCmd := fs.String("go", "go", "with -split: the go command that builds each side")
	seed := fs.Uint64("seed", 1, "seed of W3's random unhealthy sets in the first run; run i uses seed+i-1, on both sides")
	if err := fs.Parse(args); err != nil {
		return err
	}
	goSet := false
	fs.Visit(func(f *flag.Flag) { goSet = goSet || f.Name == "go" })
	if goSet && !*split {
		return errors.New("compare: -go names the go command of -split's builds; without -split this program runs both sides")
	}
	if !*split && (!devmgrLinked || !kubeletLinked) {
		// The report describes the default mode as one program that links
		// both implementations.
		return errors.New("compare: this program was built with -tags devmgronly or kubeletonly; build it without tags, or pass -split")
	}
	if *runs < 1 {
		return errors.New("compare: -runs must be at least 1")
	}
	impls := strings.Split(*implList, ",")
	for _, impl := range impls {
		if impl != "devmgr" && impl != "kubelet" {
			return fmt.Errorf("compare: unknown implementation %q", impl)
		}
	}
	var filter *regexp.Regexp
	if *only != "" {
		var err error
		if filter, err = regexp.Compile(*only); err != nil {
			return err
		}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	wd, err := filepath.EvalSymlinks(*workdir)
	if err != nil {
		return err
	}
	if wd == "/var/lib" || strings.HasPrefix(wd, "/var/lib/") {
		return fmt.Errorf("compare: -workdir %s is under /var/lib, which the kubelet side covers with a tmpfs", wd)
	}
	if slices.Contains(impls, "kubelet") {
		if err := checkNamespaces(); err != nil {
			return err
		}
	}
	machine := describeMachine(wd)
	if *rev != "" {
		machine.Commit = *rev
	}
	if machine.FSType == "tmpfs" {
		return fmt.Errorf("compare: -workdir %s is on tmpfs; fsync must cost what it costs on disk", wd)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	base, err := os.MkdirTemp(wd, "devmgr-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(base)
	common := []string{"-poll", poll.String(), "-pin=" + strconv.FormatBool(*pin)}
	d := &driver{self: self, bins: map[string]string{"devmgr": self, "kubelet": self}, base: base, impls: impls,
		timeout: *timeout, common: common, results: map[string]map[string][]result{}, prep: map[string]result{}}
	binaries := binaryInfo{one: fileSize(self)}
	if *split {
		binDir, err := os.MkdirTemp("", "devmgr-bench-bin-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(binDir)
		if d.bins, err = buildSides(ctx, *goCmd, binDir); err != nil {
			return err
		}
		binaries = binaryInfo{split: true, devmgr: fileSize(d.bins["devmgr"]), kubelet: fileSize(d.bins["kubelet"])}
		binaries.dirFS, binaries.dirSrc = mountOf(binDir)
		logf("built devmgr's side (%s) and the kubelet's (%s)", formatBytes(float64(binaries.devmgr)), formatBytes(float64(binaries.kubelet)))
	}

	started := time.Now()
	var selected []job
	for _, j := range jobs {
		if filter == nil || filter.MatchString(j.name()) {
			selected = append(selected, j)
		}
	}
	needPrep := filter == nil || filter.MatchString("W4") || filter.MatchString("floor")
	if needPrep {
		// W4 restarts on the checkpoint each implementation left after
		// admitting 1,000 pods; the floor writes a file of that size.
		for _, impl := range impls {
			dir := filepath.Join(base, "w4-"+impl)
			res := d.child(ctx, impl, dir, "W4prep", nil)
			d.prep[impl] = res
			logf("prepare W4 %-7s %s", impl, summary(res))
		}
	}
	floorSize := 0
	for _, impl := range []string{"devmgr", "kubelet"} {
		if p, ok := d.prep[impl]; ok && p.Status == statusOK && floorSize == 0 {
			floorSize = int(p.Metrics["checkpoint_bytes"])
		}
	}

	for r := range *runs {
		// Alternate which implementation goes first, so that neither always
		// runs on a machine the other has just warmed or heated.
		order := slices.Clone(impls)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		// Both sides of one run get the same seed, so the same updates.
		runSeed := []string{"-seed", strconv.FormatUint(*seed+uint64(r), 10)}
		for _, j := range selected {
			for _, impl := range order {
				dir := filepath.Join(base, fmt.Sprintf("r%d-%s-%s", r+1, strings.NewReplacer("/", "", "=", "").Replace(j.name()), impl))
				if j.workload == "W4" {
					dir = filepath.Join(base, "w4-"+impl)
					if p := d.prep[impl]; p.Status != statusOK {
						d.add(j, result{Impl: impl, Workload: "W4", Status: p.Status, Note: "preparation failed: " + p.Note})
						continue
					}
				}
				res := d.child(ctx, impl, dir, j.workload, slices.Concat(j.args, runSeed))
				if j.workload != "W4" {
					_ = os.RemoveAll(dir)
				}
				d.add(j, res)
				logf("run %d/%d %-12s %-7s %s", r+1, *runs, j.name(), impl, summary(res))
			}
		}
		// The floors: what the disk and the wire cost without any manager.
		var floors []job
		if floorSize > 0 {
			floors = append(floors, job{"floor", "", []string{"-size", fmt.Sprint(floorSize)}})
		}
		// And on files of the sizes the checkpoint has in the middle of W2's
		// first and last 100 admissions.
		if w2 := d.results["W2"]["devmgr"]; len(w2) > 0 && w2[len(w2)-1].Status == statusOK {
			m := w2[len(w2)-1].Metrics
			for _, v := range []string{"first100", "last100"} {
				if size := int(m[v+"_bytes"]); size > 0 {
					floors = append(floors, job{"floor", v, []string{"-size", fmt.Sprint(size)}})
				}
			}
			// And W2's whole sequence of growing writes, with no manager.
			if size := int(m["checkpoint_bytes"]); size > 0 {
				floors = append(floors, job{"floorgrow", "", []string{"-size", fmt.Sprint(size)}})
			}
		}
		if slices.ContainsFunc(selected, func(j job) bool { return j.workload == "W3" }) {
			floors = append(floors, job{"W3wire", "", nil})
		}
		for _, j := range floors {
			impl := map[string]string{"floor": "disk", "floorgrow": "disk", "W3wire": "wire"}[j.workload]
			dir := filepath.Join(base, fmt.Sprintf("r%d-%s%s", r+1, j.workload, j.variant))
			res := d.child(ctx, impl, dir, j.workload, slices.Concat(j.args, runSeed))
			_ = os.RemoveAll(dir)
			d.add(j, res)
			logf("run %d/%d %-12s %-7s %s", r+1, *runs, j.name(), impl, summary(res))
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}

	rep := &report{
		command:  "cd bench && go run . compare " + shellJoin(args),
		machine:  machine,
		started:  started,
		elapsed:  time.Since(started),
		runs:     *runs,
		impls:    impls,
		results:  d.results,
		prep:     d.prep,
		floorLen: floorSize,
		loads:    d.loads,
		poll:     *poll,
		pin:      *pin,
		binaries: binaries,
		seed:     *seed,
	}
	text := rep.markdown()
	if *out != "" {
		if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(*out, []byte(text), 0o644); err != nil {
			return err
		}
		logf("wrote %s", *out)
	} else {
		fmt.Print(text)
	}
	return nil
}

func (d *driver) add(j job, res result) {
	m := d.results[j.name()]
	if m == nil {
		m = map[string][]result{}
		d.results[j.name()] = m
	}
	m[res.Impl] = append(m[res.Impl], res)
}

// child runs `bench run` for one workload in a fresh process, the kubelet's
// in its own mount namespace, and returns its result. A process that dies
// without printing one (the kubelet's manager can crash the process) is
// reported as crashed, with the first line of its panic.
func (d *driver) child(ctx context.Context, impl, dir, workload string, extra []string) result {
	res := result{Impl: impl, Workload: workload}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		res.Status, res.Note = statusError, err.Error()
		return res
	}
	argv := append([]string{"run", "-impl", impl, "-workload", workload, "-dir", dir}, extra...)
	argv = append(argv, d.common...)
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	var cmd *exec.Cmd
	if impl == "kubelet" {
		cmd = exec.CommandContext(ctx, "unshare", append([]string{"-m", "--propagation", "private",
			"sh", "-c", nsScript, "bench-ns", dir, d.bins["kubelet"]}, argv...)...)
	} else {
		cmd = exec.CommandContext(ctx, d.bins["devmgr"], argv...)
	}
	d.loads = append(d.loads, loadAvg())
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()

	parsed := false
	sc := bufio.NewScanner(&stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) > 0 && line[0] == '{' && json.Unmarshal(line, &res) == nil {
			parsed = true
		}
	}
	res.Impl = impl
	if !parsed {
		res.Status = statusCrashed
		res.Note = crashLine(stderr.String(), runErr)
	} else if runErr != nil && res.Status == statusOK {
		res.Status, res.Note = statusError, runErr.Error()
	}
	if res.PeakRSS == 0 && cmd.ProcessState != nil {
		if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
			res.PeakRSS = ru.Maxrss // KiB on Linux
		}
	}
	return res
}

// crashLine picks the line that says why a process died.
func crashLine(stderr string, err error) string {
	var last string
	for line := range strings.Lines(stderr) {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "fatal error:") || strings.HasPrefix(line, "panic:") {
			return line
		}
		if line != "" {
			last = line
		}
	}
	if last == "" && err != nil {
		last = err.Error()
	}
	if len(last) > 300 {
		last = last[:300] + "..."
	}
	return last
}

func summary(r result) string {
	var parts []string
	for _, k := range []string{"register_ns", "p50_ns", "visible_ns", "start_ns", "pods_per_s", "call_ns", "write_ns", "checkpoint_bytes"} {
		if v, ok := r.Metrics[k]; ok {
			parts = append(parts, k+"="+formatValue(k, v))
		}
	}
	s := r.Status
	if len(parts) > 0 {
		s += " " + strings.Join(parts, " ")
	}
	if r.Status != statusOK && r.Note != "" {
		s += " (" + r.Note + ")"
	}
	return s
}

// checkNamespaces makes sure the kubelet side can run: root, and unshare -m.
func checkNamespaces() error {
	if os.Geteuid() != 0 {
		return errors.New("compare: the kubelet side needs root (a private mount namespace and a bind mount on /var/lib/kubelet/device-plugins); run as root or with -impls devmgr")
	}
	out, err := exec.Command("unshare", "-m", "--propagation", "private", "true").CombinedOutput()
	if err != nil {
		return fmt.Errorf("compare: unshare -m is not permitted here (%w: %s); run with -impls devmgr", err, bytes.TrimSpace(out))
	}
	return nil
}

// shellJoin joins args for a shell, quoting those that need it.
func shellJoin(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = a
		if a == "" || strings.ContainsAny(a, " \t\n'\"$`\\;&|()<>*?") {
			out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return strings.Join(out, " ")
}

// loadAvg returns the 1-minute load average, NaN when unknown.
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return math.NaN()
	}
	var l float64
	if _, err := fmt.Sscanf(string(b), "%f", &l); err != nil {
		return math.NaN()
	}
	return l
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

// buildSides builds this program twice into dir, from the sources in the
// working directory (bench/, where make bench-compare runs it), and returns
// the binaries by side: with -tags devmgronly, which links devmgr and no
// k8s.io/kubernetes package, and with -tags kubeletonly, which links the
// kubelet's device manager and none of devmgr but the plugin. Each side
// then carries what its implementation needs and nothing of the other's:
// in one binary, every process initialises k8s.io/kubernetes's packages
// (memory allocated before main, and more of the binary resident),
// whichever side it runs. Both builds use the same toolchain as
// this program (checked) and the flags of go run (no symbol table, no
// DWARF); dir should not be on the disk the runs measure, and the builds
// are flushed to disk before any run starts.
func buildSides(ctx context.Context, goCmd, dir string) (map[string]string, error) {
	src, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	mod, err := os.ReadFile(filepath.Join(src, "go.mod"))
	if err != nil || !bytes.HasPrefix(mod, []byte("module github.com/openkubelet/devmgr/bench\n")) {
		return nil, fmt.Errorf("compare -split: run it in bench/ (it builds each side's binary from there)")
	}
	bins := map[string]string{}
	for side, tag := range map[string]string{"devmgr": "devmgronly", "kubelet": "kubeletonly"} {
		out := filepath.Join(dir, "bench-"+tag)
		cmd := exec.CommandContext(ctx, goCmd, "build", "-tags", tag, "-ldflags=-s -w", "-o", out, ".")
		cmd.Dir = src
		if b, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("compare: build %s's side: %w\n%s", side, err, bytes.TrimSpace(b))
		}
		info, err := buildinfo.ReadFile(out)
		if err != nil {
			return nil, fmt.Errorf("compare: %s: %w", out, err)
		}
		if info.GoVersion != runtime.Version() {
			return nil, fmt.Errorf("compare: %s built %s with %s, this program is %s; pass -go", goCmd, out, info.GoVersion, runtime.Version())
		}
		bins[side] = out
	}
	unix.Sync()
	return bins, nil
}

// binaryInfo says how the sides ran (split: each in a build of its own)
// and the sizes of the program that ran both, or of each side's.
type binaryInfo struct {
	split                bool
	one, devmgr, kubelet int64
	// dirFS and dirSrc: the file system type and source of the temporary
	// directory of the -split builds.
	dirFS, dirSrc string
}

func fileSize(path string) int64 {
	info, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return info.Size()
}

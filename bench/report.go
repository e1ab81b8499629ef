package main

import (
	"fmt"
	"maps"
	"math"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"time"
)

// machine describes where the numbers were taken.
type machine struct {
	CPUs    int
	CPU     string
	Kernel  string
	Memory  string
	Workdir string
	FSType  string
	FSSrc   string
	Go      string
	Commit  string
}

func describeMachine(workdir string) machine {
	m := machine{CPUs: runtime.NumCPU(), Workdir: workdir, Go: runtime.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				var kib float64
				if _, err := fmt.Sscanf(strings.TrimSpace(v), "%f", &kib); err == nil {
					m.Memory = fmt.Sprintf("%.1f GiB", kib/(1<<20))
				}
			}
		}
	}
	m.FSType, m.FSSrc = mountOf(workdir)
	if out, err := exec.Command("git", "-C", "..", "rev-parse", "--short", "HEAD").Output(); err == nil {
		m.Commit = strings.TrimSpace(string(out))
		// The report itself changes with every run: it does not count.
		if st, err := exec.Command("git", "-C", "..", "status", "--porcelain", "--untracked-files=no",
			"--", ".", ":!docs/PERFORMANCE.md").Output(); err == nil && len(st) > 0 {
			m.Commit += " (with uncommitted changes)"
		}
	}
	return m
}

// mountOf returns the filesystem type and source of the mount holding path,
// from /proc/self/mountinfo.
func mountOf(path string) (fstype, source string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "unknown", ""
	}
	best := -1
	for line := range strings.Lines(string(b)) {
		pre, post, ok := strings.Cut(strings.TrimSpace(line), " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 2 {
			continue
		}
		mp := f[4]
		if (path == mp || strings.HasPrefix(path, strings.TrimSuffix(mp, "/")+"/")) && len(mp) > best {
			best, fstype, source = len(mp), g[0], g[1]
		}
	}
	return fstype, source
}

// report renders the results as markdown.
type report struct {
	command  string
	machine  machine
	started  time.Time
	elapsed  time.Duration
	runs     int
	impls    []string
	results  map[string]map[string][]result
	prep     map[string]result
	floorLen int
	loads    []float64
	poll     time.Duration
	pin      bool
	binaries binaryInfo
	b        strings.Builder
}

// row is one line of the results table: one metric of one workload.
type row struct {
	job, metric, label string
	higherBetter       bool
}

var rows = []row{
	{"W1/n=8", "register_ns", "W1 register 8 devices, until visible", false},
	{"W1/n=1000", "register_ns", "W1 register 1,000 devices", false},
	{"W1/n=10000", "register_ns", "W1 register 10,000 devices", false},
	{"W1/n=100000", "register_ns", "W1 register 100,000 devices", false},
	{"W1/n=10000", "update_ns", "W1 update 10% of 10,000, until visible", false},
	{"W1/n=100000", "update_ns", "W1 update 10% of 100,000, until visible", false},
	{"W2", "p50_ns", "W2 admit 1,000 pods: per-pod p50", false},
	{"W2", "p99_ns", "W2 per-pod p99", false},
	{"W2", "first100_mean_ns", "W2 first 100 pods, mean", false},
	{"W2", "last100_mean_ns", "W2 last 100 pods, mean", false},
	{"W2", "total_ns", "W2 all 1,000 pods", false},
	{"W3/pods=0", "visible_ns", "W3 a fresh random 10% of 10,000 unhealthy, 0 pods: visible", false},
	{"W3/pods=0", "durable_ns", "W3 same, until the checkpoint is replaced", false},
	{"W3/pods=1000", "visible_ns", "W3 a fresh random 10% of 10,000 unhealthy, 1,000 pods: visible", false},
	{"W3/pods=1000", "durable_ns", "W3 same, until the checkpoint is replaced", false},
	{"W3direct/pods=0", "call_ns", "W3 random, 0 pods, through PluginListAndWatchReceiver: until it returns (applied, on disk)", false},
	{"W3direct/pods=1000", "call_ns", "W3 the same with 1,000 pods", false},
	{"W3/pods=0,alternating", "visible_ns", "W3 alternating (no target): the same 10% unhealthy, then healthy again, 0 pods: visible", false},
	{"W3/pods=0,alternating", "durable_ns", "W3 same, until the checkpoint is replaced", false},
	{"W3direct/pods=0,alternating", "call_ns", "W3 alternating through PluginListAndWatchReceiver", false},
	{"W4", "start_ns", "W4 NewManagerImpl+Start, 1,000-pod checkpoint", false},
	{"W5/g=1", "pods_per_s", "W5 admit, one goroutine (A and B alternating)", true},
	{"W5/g=2", "pods_per_s", "W5 admit, two goroutines (one per resource)", true},
	{"W6", "call_ns", "W6 GetTopologyHints, 10,000 devices, per call", false},
}

// values returns the per-run values of metric for job and impl, from runs
// that completed; index i is run i, NaN where that run has no value.
func (r *report) values(job, impl, metric string) []float64 {
	var out []float64
	for _, res := range r.results[job][impl] {
		v, ok := res.Metrics[metric]
		if res.Status != statusOK || !ok {
			v = math.NaN()
		}
		out = append(out, v)
	}
	return out
}

func finite(xs []float64) spread {
	var s spread
	for _, x := range xs {
		if !math.IsNaN(x) {
			s.values = append(s.values, x)
		}
	}
	return s
}

// cell formats one implementation's figures for a row: median [min–max],
// or what happened instead.
func (r *report) cell(job, impl, metric string) string {
	all := r.results[job][impl]
	if len(all) == 0 {
		return "not run"
	}
	s := finite(r.values(job, impl, metric))
	bad := map[string]int{}
	for _, res := range all {
		if res.Status != statusOK {
			bad[res.Status]++
		}
	}
	var out string
	if s.ok() {
		out = formatValue(metric, s.med())
		if len(s.values) > 1 {
			out += fmt.Sprintf(" [%s–%s]", formatValue(metric, s.low()), formatValue(metric, s.high()))
		}
	}
	for _, st := range []string{statusRefused, statusCrashed, statusError} {
		if n := bad[st]; n > 0 {
			note := fmt.Sprintf("%s %d/%d", st, n, len(all))
			if out == "" {
				out = "**" + note + "**"
			} else {
				out += " (" + note + ")"
			}
		}
	}
	return out
}

// ratio returns median(devmgr)/median(kubelet) and the range of the per-run
// ratios (run i of one against run i of the other, taken back to back).
func (r *report) ratio(job, metric string) (med float64, lo, hi float64, ok bool) {
	a, b := r.values(job, "devmgr", metric), r.values(job, "kubelet", metric)
	sa, sb := finite(a), finite(b)
	if !sa.ok() || !sb.ok() {
		return 0, 0, 0, false
	}
	med = sa.med() / sb.med()
	lo, hi = math.Inf(1), math.Inf(-1)
	for i := range min(len(a), len(b)) {
		if x := a[i] / b[i]; !math.IsNaN(x) {
			lo, hi = math.Min(lo, x), math.Max(hi, x)
		}
	}
	return med, lo, hi, true
}

func (r *report) rss(job, impl string) (float64, bool) {
	xs := r.rssValues(job, impl)
	if len(xs) == 0 {
		return 0, false
	}
	return medianOf(xs), true
}

// startRSS returns impl's RSS at the start of every run of every job, in KiB.
func (r *report) startRSS(impl string) spread {
	var xs []float64
	for _, byImpl := range r.results {
		for _, res := range byImpl[impl] {
			if res.StartRSS > 0 {
				xs = append(xs, float64(res.StartRSS))
			}
		}
	}
	return finite(xs)
}

// rssValues returns the peak RSS of every run, in KiB.
func (r *report) rssValues(job, impl string) []float64 {
	var xs []float64
	for _, res := range r.results[job][impl] {
		if res.PeakRSS > 0 {
			xs = append(xs, float64(res.PeakRSS))
		}
	}
	return xs
}

// rssSpread is the median peak RSS of job's runs with their range, in MiB.
func (r *report) rssSpread(job, impl string) string {
	xs := r.rssValues(job, impl)
	return fmt.Sprintf("%.1f [%.1f–%.1f]", medianOf(xs)/1024, slices.Min(xs)/1024, slices.Max(xs)/1024)
}

// allOK reports whether every run of job by impl completed.
func (r *report) allOK(job, impl string) bool {
	for _, res := range r.results[job][impl] {
		if res.Status != statusOK {
			return false
		}
	}
	return true
}

func (r *report) rssCell(job, impl string) string {
	if v, ok := r.rss(job, impl); ok {
		return formatKiB(v)
	}
	return "–"
}

func (r *report) p(format string, args ...any) { fmt.Fprintf(&r.b, format, args...) }

func (r *report) markdown() string {
	m := r.machine
	r.p("# Performance: devmgr against the kubelet's device manager\n\n")
	r.p("Generated by `make bench-compare`, that is `%s`, on %s UTC (%s).\n",
		r.command, r.started.UTC().Format("2006-01-02 15:04"), r.elapsed.Round(time.Second))
	r.p("Do not edit: run it again (root, `unshare -m`). Code: `bench/` (a separate module).\n\n")
	r.p("## Machine\n\n| | |\n|---|---|\n")
	r.p("| CPUs (nproc) | %d |\n| CPU | %s |\n| kernel | %s |\n| memory | %s |\n", m.CPUs, m.CPU, m.Kernel, m.Memory)
	r.p("| disk of every run directory | %s on %s (%s) |\n", m.FSType, m.FSSrc, m.Workdir)
	if l := finite(r.loads); l.ok() {
		r.p("| 1-minute load average when the runs started | median %.2f, min %.2f, max %.2f |\n", l.med(), l.low(), l.high())
	}
	r.p("| Go | %s |\n| devmgr | commit %s |\n", m.Go, m.Commit)
	r.p("| kubelet | k8s.io/kubernetes v1.37.2, `pkg/kubelet/cm/devicemanager` (staging modules at v0.37.2) |\n\n")
	if l := finite(r.loads); l.ok() && l.high() > float64(m.CPUs) {
		r.p("**The machine was busy with other work during these runs** (load average up to %.1f on %d CPUs): the figures are noisier than usual; the ratios, taken from runs back to back, suffer less than the absolute times.\n\n", l.high(), m.CPUs)
	}
	r.method()
	r.table()
	r.targets()
	r.notes()
	r.raw()
	return r.b.String()
}

func (r *report) method() {
	r.p("## Method\n\n")
	r.p("- Every workload runs %d times per implementation, each time in a fresh process (`bench run -impl devmgr|kubelet -workload W…`, one JSON line out); the two implementations alternate, and which goes first alternates from run to run. Figures are the median of the runs, [min–max] across runs.\n", r.runs)
	r.p("- The ratio is devmgr's median over the kubelet's, from the same `compare` invocation; the bracket is the range of the per-run ratios (run *i* of devmgr against run *i* of the kubelet, taken back to back). Below 1 devmgr is faster; for W5 (pods/s) above 1 is better.\n")
	r.p("- Both sides are driven through the same calls an embedding kubelet makes (NewManagerImpl, Start, Allocate, GetCapacity, GetDevices, GetTopologyHints, Stop), against the same real gRPC plugin (`plugintest`) over unix sockets, in the same process. Both get a machine of 2 NUMA nodes and a topology store with no affinity (the \"none\" policy); pod sources are ready; logging is discarded.\n")
	r.p("- The kubelet's manager hard-codes /var/lib/kubelet/device-plugins: its runs execute in a private mount namespace where that path is a bind mount of the run's directory, next to devmgr's on the same disk (%s, %s). The host's /var/lib/kubelet is never touched.\n", r.machine.FSType, r.machine.Workdir)
	r.p("- Device IDs are 40-byte GPU-style UUIDs, each with one NUMA node (alternating 0, 1); pods have one container asking for one device.\n")
	r.p("- *Visible*: from the plugin's `Update` (or `Register`) until `GetCapacity` shows the new allocatable, %s *Durable*: until the checkpoint file has been replaced (the rename; devmgr's directory fsync after it is not included). Both implementations update their state before writing the checkpoint. This end-to-end time includes the plugin's send and the gRPC transfer, which both sides share; the floor below (W3's message alone, to a bare gRPC client) is that part. So W3 also hands each message to `PluginListAndWatchReceiver`, the method the kubelet's plugin client calls for every message it receives, which both modules export: timed until the call returns, by when both implementations have applied the list and written the checkpoint (the run checks both; devmgr's call also includes its fsync of the directory, which the kubelet does not do), with no plugin send and no gRPC. Each message is built afresh outside the timed call, as a client that decodes every message whole (the kubelet's) hands it over; devmgr's own client passes unchanged devices as the values it already holds, so this is the harder case for devmgr. The W3 targets are shown for both ways. After every write seen on disk a run pauses 100 ms before its next timed step, so that no step pays for the tail of the previous write; and before each timed step (before the first, for steps timed back to back: W2's admissions, W5, W6's calls) it collects its garbage (`runtime.GC`, as go test does before a benchmark), so that no step pays for the garbage of the run's setup: the devices and messages it built. Without that collection, whether the one the setup's garbage was due fell inside a step or before it decided most of W1's spread (8 runs each with 10,000 devices on 2026-11-30: devmgr 9.5–16.6 ms without, 6.2–15.5 ms with; the kubelet 25.7–40.0 and 25.0–32.9 ms).\n", r.pollText())
	r.p("- The poll's own lag. On the machine of 2026-11-30 (kernel 6.18.44-fc, 2 CPUs) the kernel builds no scheduling domains, so a thread woken from its sleep stays on the CPU it last ran on: `perf sched` showed the poller's wakeup waiting up to 2 ms behind the thread applying an update while the other CPU was idle, and in W3 the pause before the successful poll had a median of 0.9 to 2.2 ms per run. The other way round, a manager thread that shares its CPU with the poller's wakeups (one every 25 µs) runs slower than one that does not, and which of the two happens changes from run to run. A real-time (SCHED_FIFO) poller removed the lag but made every run about ten times slower. %s\n", r.pinText())
	r.p("- W1: register a plugin with N devices, then one update making 10%% of them unhealthy. W2: 1,000 pods admitted one after the other on 1,000 devices. W3: 10 updates per run of 10,000 devices, each marking a fresh random 10%% unhealthy and the rest healthy (1,000 and 900 in turn, so that allocatable changes with every update), drawn from a seed that run *i* gives both sides alike, so that no state of a run comes back; with 1,000 pods the sets are drawn from all the devices, held or not; median per run. W3 *alternating* (0 pods, no target): the same 10%% unhealthy, then healthy again, in turn. W4: a process admits 1,000 pods and stops; then each run, in a fresh process, times NewManagerImpl+Start+GetCapacity on that checkpoint. W5: 500 pods each of two resources (500 devices each); throughput of admitting all 1,000. W6: 200 calls, median per call, for a container asking for one of 10,000 devices.\n")
	if r.floorLen > 0 {
		r.p("- The floor: one durable write (temp file, write, fsync, rename, fsync of the directory) of %s, the size of devmgr's checkpoint after W4's 1,000 admissions, on the same disk; 30 writes per run, median. The same on files of the checkpoint's size after 50 and after 950 of W2's admissions (the middle of its first and of its last 100), so that W2's growth can be set against the disk's own. And W2's own sequence of writes with no manager: 1,000 durable writes of a file growing in equal steps to the final checkpoint's size, 0.5 ms apart; the means of the first and last 100. A file rewritten at one size costs less than one that grew write by write to that size, so it is the last row, not the fixed-size ones, that W2's growth is set against.\n", formatBytes(float64(r.floorLen)))
	}
	if r.binaries.split {
		r.p("- `-split`: each side runs in a build of `bench/` that links its own implementation only: devmgr's side (and the floors) with `-tags devmgronly` (%s), which links no k8s.io/kubernetes package, the kubelet's with `-tags kubeletonly` (%s), which links none of devmgr but the plugin. Each process then carries the dependencies of its implementation only: every kubelet process initialises k8s.io/kubernetes's packages before main, no devmgr process does. Peak RSS is then each implementation as deployed, but the timings are not like for like: devmgr's process starts with a smaller heap, so the garbage collector's cycles come at other points, often inside the timed steps.\n", formatBytes(float64(r.binaries.devmgr)), formatBytes(float64(r.binaries.kubelet)))
		switch {
		case r.binaries.dirFS == r.machine.FSType && r.binaries.dirSrc == r.machine.FSSrc:
			// The builds' writes reached the runs' disk (synced before the first run).
			r.p("- The two builds were written to a temporary directory on the runs' file system (%s on %s), and synced before the first run.\n", r.binaries.dirFS, r.binaries.dirSrc)
		case r.binaries.dirFS == "tmpfs":
			r.p("- The two builds were written to a temporary directory in memory (tmpfs), off the runs' disk.\n")
		default:
			r.p("- The two builds were written to a temporary directory on another file system than the runs' (%s on %s), and synced before the first run.\n", r.binaries.dirFS, r.binaries.dirSrc)
		}
	} else {
		r.p("- Both sides and the floors run in the same build of `bench/` (%s), which links both implementations, so that both run in the same program: every process initialises k8s.io/kubernetes's packages before main (the kubelet's side needs them), devmgr's too, which a program embedding devmgr would not. The figures compare the two managers' own work and memory on top of that; `-split` runs each side in a build of its own implementation instead.\n", formatBytes(float64(r.binaries.one)))
	}
	r.p("- Peak RSS is VmHWM of the run's process, which also hosts the plugin (identical on both sides). It moves by several MiB from run to run of the same workload (it depends on when the garbage collector runs), so where devmgr's median is the higher the targets show both ranges.\n\n")
}

func (r *report) table() {
	r.p("## Results\n\n")
	r.p("| workload | devmgr | kubelet | devmgr/kubelet | peak RSS devmgr | peak RSS kubelet |\n")
	r.p("|---|---|---|---|---|---|\n")
	for _, row := range rows {
		if r.results[row.job] == nil {
			continue
		}
		ratio := "–"
		if med, lo, hi, ok := r.ratio(row.job, row.metric); ok {
			ratio = fmt.Sprintf("%.3gx [%.3g–%.3g]", med, lo, hi)
		}
		r.p("| %s | %s | %s | %s | %s | %s |\n", row.label,
			r.cell(row.job, "devmgr", row.metric), r.cell(row.job, "kubelet", row.metric), ratio,
			r.rssCell(row.job, "devmgr"), r.rssCell(row.job, "kubelet"))
	}
	r.p("\n")
	if r.results["floor"] != nil || r.results["floor/first100"] != nil || r.results["floorgrow"] != nil || r.results["W3wire"] != nil {
		r.p("Floors, measured in the same runs with no manager at all:\n\n| floor | median [min–max] | peak RSS |\n|---|---|---|\n")
		if r.results["floor"] != nil {
			r.p("| one durable write of %s (temp file, fsync, rename, directory fsync) | %s | %s |\n",
				formatBytes(float64(r.floorLen)), r.cell("floor", "disk", "write_ns"), r.rssCell("floor", "disk"))
		}
		for _, v := range []struct{ name, when string }{
			{"first100", "in the middle of W2's first 100 admissions"},
			{"last100", "in the middle of W2's last 100"},
		} {
			job := "floor/" + v.name
			if sizes := finite(r.values("W2", "devmgr", v.name+"_bytes")); r.results[job] != nil && sizes.ok() {
				r.p("| the same, of %s (the checkpoint's size %s) | %s | %s |\n",
					formatBytes(sizes.med()), v.when, r.cell(job, "disk", "write_ns"), r.rssCell(job, "disk"))
			}
		}
		if r.results["floorgrow"] != nil {
			r.p("| W2's writes alone: 1,000 durable writes of a file growing in equal steps to %s, mean of the first 100 → of the last 100 | %s → %s | %s |\n",
				formatBytes(finite(r.values("floorgrow", "disk", "bytes")).med()),
				r.cell("floorgrow", "disk", "first100_ns"), r.cell("floorgrow", "disk", "last100_ns"),
				r.rssCell("floorgrow", "disk"))
		}
		if r.results["W3wire"] != nil {
			r.p("| W3's message alone: plugin Update until a bare gRPC client has received the 10,000 devices | %s | %s |\n",
				r.cell("W3wire", "wire", "visible_ns"), r.rssCell("W3wire", "wire"))
		}
		r.p("\n")
	}
	var sizes []string
	for _, n := range []string{"8", "1000", "10000", "100000"} {
		if s := finite(r.values("W1/n="+n, "devmgr", "message_bytes")); s.ok() {
			sizes = append(sizes, fmt.Sprintf("%s devices: %s", n, formatBytes(s.med())))
		}
	}
	if len(sizes) > 0 {
		r.p("ListAndWatch message sizes in W1: %s (the kubelet accepts at most 4 MiB).\n", strings.Join(sizes, ", "))
	}
	for _, impl := range r.impls {
		if p, ok := r.prep[impl]; ok {
			r.p("Checkpoint after 1,000 admissions, %s: %s.\n", impl, formatValue("checkpoint_bytes", p.Metrics["checkpoint_bytes"]))
		}
	}
	r.p("\n")
}

type verdict struct {
	target, measured string
	pass             *bool // nil: not measured
}

func pass(b bool) *bool { return &b }

func (r *report) targets() {
	var vs []verdict
	ratioTarget := func(name, job, metric string, limit float64) {
		v := verdict{target: fmt.Sprintf("%s ≤ %gx the kubelet's", name, limit)}
		if med, lo, hi, ok := r.ratio(job, metric); ok {
			v.measured = fmt.Sprintf("%.3gx (per run %.3g–%.3g)", med, lo, hi)
			v.pass = pass(med <= limit)
		} else if r.results[job] != nil {
			v.measured = "devmgr " + r.cell(job, "devmgr", metric) + "; kubelet " + r.cell(job, "kubelet", metric)
		}
		vs = append(vs, v)
	}
	ratioTarget("W2 per-pod p50", "W2", "p50_ns", 0.2)

	v := verdict{target: "W2 devmgr last-100 mean ≤ 1.3x its first-100 mean"}
	first, last := r.values("W2", "devmgr", "first100_mean_ns"), r.values("W2", "devmgr", "last100_mean_ns")
	var growth []float64
	for i := range min(len(first), len(last)) {
		growth = append(growth, last[i]/first[i])
	}
	if g := finite(growth); g.ok() {
		v.measured = fmt.Sprintf("%.3gx (per run %.3g–%.3g)", g.med(), g.low(), g.high())
		v.pass = pass(g.med() <= 1.3)
		f, l := finite(r.values("floor/first100", "disk", "write_ns")), finite(r.values("floor/last100", "disk", "write_ns"))
		if f.ok() && l.ok() {
			v.measured += fmt.Sprintf("; the disk alone, on files of those sizes: %.3gx (%s → %s)",
				l.med()/f.med(), formatNs(f.med()), formatNs(l.med()))
		}
		f, l = finite(r.values("floorgrow", "disk", "first100_ns")), finite(r.values("floorgrow", "disk", "last100_ns"))
		if f.ok() && l.ok() {
			v.measured += fmt.Sprintf("; W2's own sequence of growing writes, alone: %.3gx (%s → %s)",
				l.med()/f.med(), formatNs(f.med()), formatNs(l.med()))
			df, dl := finite(first), finite(last)
			if df.ok() && dl.ok() {
				v.measured += fmt.Sprintf("; devmgr's admissions without that write: %s → %s",
					formatNs(df.med()-f.med()), formatNs(dl.med()-l.med()))
			}
		}
	}
	vs = append(vs, v)

	v = verdict{target: "W2 devmgr per-pod p50 ≤ 1.5x the durable-write floor"}
	if p50, fl := finite(r.values("W2", "devmgr", "p50_ns")), finite(r.values("floor", "disk", "write_ns")); p50.ok() && fl.ok() {
		v.measured = fmt.Sprintf("%.3gx (p50 %s, floor %s)", p50.med()/fl.med(), formatNs(p50.med()), formatNs(fl.med()))
		v.pass = pass(p50.med() <= 1.5*fl.med())
	}
	vs = append(vs, v)

	// W3 end to end, as the plugin's message reaches each manager over
	// gRPC, and the managers' own work, the message handed to
	// PluginListAndWatchReceiver: both against the same limits.
	for _, w3 := range []struct {
		pods  string
		limit float64
	}{{"0", 0.1}, {"1000", 0.05}} {
		label := map[string]string{"0": "0 pods", "1000": "1,000 pods"}[w3.pods]
		ratioTarget("W3 update, "+label+" (visible)", "W3/pods="+w3.pods, "visible_ns", w3.limit)
		if w := finite(r.values("W3wire", "wire", "visible_ns")); w.ok() && vs[len(vs)-1].pass != nil {
			vs[len(vs)-1].measured += "; the message alone takes " + formatNs(w.med())
		}
	}
	ratioTarget("W3 update, 0 pods, through PluginListAndWatchReceiver (until written)", "W3direct/pods=0", "call_ns", 0.1)
	ratioTarget("W3 update, 1,000 pods, through PluginListAndWatchReceiver (until written)", "W3direct/pods=1000", "call_ns", 0.05)
	ratioTarget("W4 start with a 1,000-pod checkpoint", "W4", "start_ns", 0.25)
	ratioTarget("W6 GetTopologyHints per call", "W6", "call_ns", 0.05)
	ratioTarget("W1 register 10,000 devices", "W1/n=10000", "register_ns", 0.5)

	v = verdict{target: "W1 devmgr registers and updates 100,000 devices"}
	if all := r.results["W1/n=100000"]["devmgr"]; len(all) > 0 {
		okRuns := 0
		for _, res := range all {
			if res.Status == statusOK {
				okRuns++
			}
		}
		v.measured = fmt.Sprintf("%d/%d runs correct (kubelet: %s)", okRuns, len(all), r.cell("W1/n=100000", "kubelet", "register_ns"))
		v.pass = pass(okRuns == len(all))
	}
	vs = append(vs, v)

	v = verdict{target: "W5 devmgr: two goroutines on two resources ≥ 1.6x one goroutine, no errors"}
	one, two := finite(r.values("W5/g=1", "devmgr", "pods_per_s")), finite(r.values("W5/g=2", "devmgr", "pods_per_s"))
	if one.ok() && two.ok() {
		faults := 0
		for _, j := range []string{"W5/g=1", "W5/g=2"} {
			for _, res := range r.results[j]["devmgr"] {
				faults += int(res.Metrics["errors"] + res.Metrics["missing"] + res.Metrics["duplicates"])
				if res.Status != statusOK {
					faults++
				}
			}
		}
		v.measured = fmt.Sprintf("%.3gx (%.0f vs %.0f pods/s), %d errors", two.med()/one.med(), two.med(), one.med(), faults)
		if k1, k2 := finite(r.values("W5/g=1", "kubelet", "pods_per_s")), finite(r.values("W5/g=2", "kubelet", "pods_per_s")); k1.ok() && k2.ok() {
			v.measured += fmt.Sprintf("; kubelet %.3gx", k2.med()/k1.med())
		}
		v.measured += "; kubelet two goroutines: " + r.cell("W5/g=2", "kubelet", "pods_per_s")
		v.pass = pass(two.med() >= 1.6*one.med() && faults == 0)
	}
	vs = append(vs, v)

	v = verdict{target: "Peak RSS of devmgr ≤ the kubelet's, in every workload"}
	var worse, compared []string
	var skipped []string
	for _, j := range jobs {
		a, okA := r.rss(j.name(), "devmgr")
		b, okB := r.rss(j.name(), "kubelet")
		if !okA || !okB {
			continue
		}
		if !r.allOK(j.name(), "devmgr") || !r.allOK(j.name(), "kubelet") {
			skipped = append(skipped, j.name())
			continue
		}
		compared = append(compared, j.name())
		if a > b {
			worse = append(worse, fmt.Sprintf("%s %s > %s MiB", j.name(), r.rssSpread(j.name(), "devmgr"), r.rssSpread(j.name(), "kubelet")))
		}
	}
	if len(compared) > 0 {
		v.pass = pass(len(worse) == 0)
		v.measured = fmt.Sprintf("%d workloads compared", len(compared))
		if len(worse) > 0 {
			v.measured += "; higher in " + strings.Join(worse, ", ")
		}
		if len(skipped) > 0 {
			v.measured += "; not comparable where a side did not complete: " + strings.Join(skipped, ", ")
		}
		if a, b := r.startRSS("devmgr"), r.startRSS("kubelet"); a.ok() && b.ok() {
			v.measured += fmt.Sprintf("; RSS of the processes when the workload started (packages initialised), median of all runs: devmgr %.1f, kubelet %.1f MiB", a.med()/1024, b.med()/1024)
		}
	}
	vs = append(vs, v)

	r.p("## Targets\n\n| target | measured | result |\n|---|---|---|\n")
	passed, failed := 0, 0
	for _, v := range vs {
		res := "not measured"
		switch {
		case v.pass == nil:
		case *v.pass:
			res, passed = "PASS", passed+1
		default:
			res, failed = "**FAIL**", failed+1
		}
		if v.measured == "" {
			v.measured = "–"
		}
		r.p("| %s | %s | %s |\n", v.target, v.measured, res)
	}
	r.p("\n%d passed, %d failed.\n\n", passed, failed)
}

// notes lists why runs were refused, crashed or failed.
func (r *report) notes() {
	type key struct{ job, impl, status, note string }
	counts := map[key]int{}
	var order []key
	for _, name := range slices.Sorted(maps.Keys(r.results)) {
		for _, impl := range []string{"devmgr", "kubelet", "disk", "wire"} {
			for _, res := range r.results[name][impl] {
				if res.Status == statusOK && res.Note == "" {
					continue
				}
				k := key{name, impl, res.Status, res.Note}
				if counts[k] == 0 {
					order = append(order, k)
				}
				counts[k]++
			}
		}
	}
	for impl, p := range r.prep {
		if p.Status != statusOK {
			k := key{"W4 preparation", impl, p.Status, p.Note}
			order = append(order, k)
			counts[k] = 1
		}
	}
	if len(order) == 0 {
		return
	}
	r.p("## Refusals, crashes and errors\n\n")
	for _, k := range order {
		r.p("- %s, %s: %s ×%d: %s\n", k.job, k.impl, k.status, counts[k], k.note)
	}
	r.p("\n")
}

// raw lists every run's figures.
func (r *report) raw() {
	r.p("## Every run\n\n<details><summary>%d fresh processes</summary>\n\n```\n", r.count())
	for _, name := range slices.Sorted(maps.Keys(r.results)) {
		for _, impl := range []string{"devmgr", "kubelet", "disk", "wire"} {
			for i, res := range r.results[name][impl] {
				keys := make([]string, 0, len(res.Metrics))
				for k := range res.Metrics {
					keys = append(keys, k)
				}
				slices.Sort(keys)
				var parts []string
				for _, k := range keys {
					parts = append(parts, k+"="+formatValue(k, res.Metrics[k]))
				}
				r.p("%-12s %-7s run %d %-7s rss=%s %s\n", name, impl, i+1, res.Status,
					formatKiB(float64(res.PeakRSS)), strings.Join(parts, " "))
			}
		}
	}
	r.p("```\n\n</details>\n")
}

func (r *report) count() int {
	n := len(r.prep)
	for _, m := range r.results {
		for _, rs := range m {
			n += len(rs)
		}
	}
	return n
}

// pinText says whether the poller had a CPU of its own.
func (r *report) pinText() string {
	if !r.pin || r.poll <= 0 {
		return "These runs left the threads where the kernel put them (`-pin=false`, or `-poll 0`): a *visible* time often ends when the manager's thread blocks (in its checkpoint write), not when it published the state, on both sides."
	}
	return "So while it polls, the poller's thread is pinned to the last CPU and every other thread of the process to the others (`sched_setaffinity`; all are let go when the poll ends; `-pin=false` leaves them alone): the manager, the plugin and gRPC share one CPU, as the poll's P already made them share one P, and the poller sees the new state as soon as it is published. On 2026-11-30, 6 interleaved runs each of W1 with 10,000 devices: devmgr 8.4–28.3 ms unpinned and 12.5–16.9 ms pinned, the kubelet 21.8–35.4 ms and 25.9–34.3 ms."
}

// pollText says how the runs polled GetCapacity and the checkpoint file.
func (r *report) pollText() string {
	if r.poll <= 0 {
		return "polled in a tight loop (yielding between polls). On 2 CPUs that loop keeps a CPU, waits in Go's global run queue while the goroutine that applied the update keeps running, and starves the runtime's network poller: on both sides the new state is seen only when that goroutine first blocks, after it has also encoded the checkpoint (execution traces, `bench run -trace`)."
	}
	return fmt.Sprintf("polled every %v: a nanosleep on a thread of the poller's own with a timer slack of 1 ns (about 25 µs from one poll to the next for 10 µs), so that the poller takes little CPU and stays out of the Go scheduler's queues; it keeps its P, as system calls this short are not handed off, so the manager, the plugin and gRPC share the other P, as they would beside any busy goroutine. (A poller yielding in a tight loop, `-poll 0`, keeps one of the 2 CPUs, waits in the global run queue while the goroutine that applied the update keeps running, and starves the runtime's network poller: execution traces showed plugin frames left unread for 1.5 ms and both managers seen only once they block in their checkpoint write. `time.Sleep` sleeps about 1.1 ms for any pause under a millisecond.) The checkpoint file is polled the same way.", r.poll)
}

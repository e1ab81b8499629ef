package main

import (
	"fmt"
	"maps"
	"math"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
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

// report renders the results as markdown: the machine, how to reproduce,
// the results, the targets and the floors. How the workloads run and are
// timed is in bench/README.md, which the report links to.
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
	seed     uint64
	b        strings.Builder
}

// row is one line of the results table: one metric of one workload.
type row struct {
	job, metric, label string
}

var rows = []row{
	{"W1/n=8", "register_ns", "W1 register 8 devices, until visible"},
	{"W1/n=1000", "register_ns", "W1 register 1,000 devices"},
	{"W1/n=10000", "register_ns", "W1 register 10,000 devices"},
	{"W1/n=100000", "register_ns", "W1 register 100,000 devices"},
	{"W1/n=10000", "update_ns", "W1 update 10% of 10,000, until visible"},
	{"W1/n=10000", "first_list_ns", "W1 a new list of 10,000 devices, through PluginListAndWatchReceiver, until it returns"},
	{"W1/n=100000", "update_ns", "W1 update 10% of 100,000, until visible"},
	{"W2", "p50_ns", "W2 admit 1,000 pods: per-pod p50"},
	{"W2", "p99_ns", "W2 per-pod p99"},
	{"W2", "first100_mean_ns", "W2 first 100 pods, mean"},
	{"W2", "last100_mean_ns", "W2 last 100 pods, mean"},
	{"W2", "total_ns", "W2 all 1,000 pods"},
	{"W3/pods=0", "visible_ns", "W3 a fresh random 10% of 10,000 unhealthy, 0 pods: visible"},
	{"W3/pods=0", "durable_ns", "W3 same, until the checkpoint is replaced"},
	{"W3direct/pods=0", "call_ns", "W3 same, through PluginListAndWatchReceiver, until it returns"},
	{"W3/pods=1000", "visible_ns", "W3 a fresh random 10%, 1,000 pods: visible"},
	{"W3/pods=1000", "durable_ns", "W3 same, until the checkpoint is replaced"},
	{"W3direct/pods=1000", "call_ns", "W3 same, through PluginListAndWatchReceiver, until it returns"},
	{"W3/pods=0,alternating", "visible_ns", "W3 alternating, no target: the same 10% unhealthy, then healthy again, 0 pods: visible"},
	{"W3/pods=0,alternating", "durable_ns", "W3 alternating, until the checkpoint is replaced"},
	{"W3direct/pods=0,alternating", "call_ns", "W3 alternating, through PluginListAndWatchReceiver"},
	{"W4", "start_ns", "W4 NewManagerImpl+Start, 1,000-pod checkpoint"},
	{"W5/g=1", "pods_per_s", "W5 admit, one goroutine (A and B alternating)"},
	{"W5/g=2", "pods_per_s", "W5 admit, two goroutines (one per resource)"},
	{"W6", "call_ns", "W6 GetTopologyHints, 10,000 devices, per call"},
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

// rssValues returns the peak RSS of every run of job by impl, in KiB.
func (r *report) rssValues(job, impl string) []float64 {
	var xs []float64
	for _, res := range r.results[job][impl] {
		if res.PeakRSS > 0 {
			xs = append(xs, float64(res.PeakRSS))
		}
	}
	return xs
}

func (r *report) rss(job, impl string) (float64, bool) {
	xs := r.rssValues(job, impl)
	if len(xs) == 0 {
		return 0, false
	}
	return medianOf(xs), true
}

// rssSpread is the median peak RSS of job's runs with their range, in MiB.
func (r *report) rssSpread(job, impl string) string {
	xs := r.rssValues(job, impl)
	return fmt.Sprintf("%.1f [%.1f–%.1f]", medianOf(xs)/1024, slices.Min(xs)/1024, slices.Max(xs)/1024)
}

func (r *report) rssCell(job, impl string) string {
	if v, ok := r.rss(job, impl); ok {
		return formatKiB(v)
	}
	return "–"
}

// allOK reports whether impl ran job and every run completed.
func (r *report) allOK(job, impl string) bool {
	all := r.results[job][impl]
	for _, res := range all {
		if res.Status != statusOK {
			return false
		}
	}
	return len(all) > 0
}

func (r *report) p(format string, args ...any) { fmt.Fprintf(&r.b, format, args...) }

func (r *report) markdown() string {
	r.p("# Performance: devmgr against the kubelet's device manager\n\n")
	r.p("Generated by `%s` on %s UTC (%s). Do not edit: run it again.\n",
		r.command, r.started.UTC().Format("2006-01-02 15:04"), r.elapsed.Round(time.Second))
	r.p("What each workload does and how it is timed: [bench/README.md](../bench/README.md).\n\n")
	r.machineTable()
	r.reproduce()
	r.table()
	r.targets()
	r.floors()
	r.notes()
	return r.b.String()
}

func (r *report) machineTable() {
	m := r.machine
	r.p("## Machine\n\n| | |\n|---|---|\n")
	r.p("| CPUs (nproc) | %d |\n| CPU | %s |\n| kernel | %s |\n| memory | %s |\n", m.CPUs, m.CPU, m.Kernel, m.Memory)
	r.p("| disk of every run directory | %s on %s (%s) |\n", m.FSType, m.FSSrc, m.Workdir)
	if l := finite(r.loads); l.ok() {
		r.p("| 1-minute load average when the runs started | median %.2f, min %.2f, max %.2f |\n", l.med(), l.low(), l.high())
	}
	r.p("| Go | %s |\n| devmgr | commit %s |\n", m.Go, m.Commit)
	r.p("| kubelet | k8s.io/kubernetes v1.37.2, `pkg/kubelet/cm/devicemanager` |\n")
	seeds := fmt.Sprintf("seed %d", r.seed)
	if r.runs > 1 {
		seeds = fmt.Sprintf("seeds %d to %d, one per run", r.seed, r.seed+uint64(r.runs)-1)
	}
	r.p("| runs | %d per workload and side, each a fresh process; the sides alternate, and which goes first alternates; W3's random updates from %s, the same on both sides |\n", r.runs, seeds)
	r.p("| poller | %s |\n", r.pollerText())
	if r.binaries.split {
		r.p("| build | `-split`: devmgr's side and the floors built with `-tags devmgronly` (%s), the kubelet's with `-tags kubeletonly` (%s), to %s on %s |\n",
			formatBytes(float64(r.binaries.devmgr)), formatBytes(float64(r.binaries.kubelet)), r.binaries.dirFS, r.binaries.dirSrc)
	} else {
		r.p("| build | one program linking both sides and the floors (%s) |\n", formatBytes(float64(r.binaries.one)))
	}
	r.p("\n")
	if l := finite(r.loads); l.ok() && l.high() > float64(m.CPUs) {
		r.p("**The machine was busy with other work during these runs** (load average up to %.1f on %d CPUs): the figures are noisier than usual; the ratios, taken from runs back to back, suffer less than the absolute times.\n\n", l.high(), m.CPUs)
	}
}

// pollerText says how the runs polled GetCapacity and the checkpoint file.
func (r *report) pollerText() string {
	if r.poll <= 0 {
		return "a tight loop yielding between polls (`-poll 0`)"
	}
	s := fmt.Sprintf("every %v (`-poll`)", r.poll)
	if r.pin {
		return s + ", on a CPU of its own while it polls (`-pin`)"
	}
	return s + ", not pinned (`-pin=false`)"
}

func (r *report) reproduce() {
	r.p("## How to reproduce\n\n")
	r.p("As root, on a machine that allows `unshare -m` (the kubelet's side runs in a private mount namespace; the host's /var/lib/kubelet is not touched), from a clone of the repository:\n\n")
	r.p("```sh\nmake bench-compare                     # cd bench && go run . compare -runs $(BENCHRUNS) -out ../docs/PERFORMANCE.md\n")
	r.p("cd bench && go run . compare -runs 1 -only '^W3' -out /tmp/w3.md   # some workloads, elsewhere\n```\n\n")
	r.p("The first build downloads and compiles k8s.io/kubernetes. `-impls devmgr` runs devmgr's side alone (no root needed); `-split` runs each side in a build of its own.\n\n")
}

func (r *report) table() {
	r.p("## Results\n\n")
	r.p("Median of the runs [min–max]. devmgr/kubelet is the ratio of the medians [the range of the per-run ratios, run *i* against run *i*]: below 1 devmgr is faster, except for W5 (pods/s), where above 1 is. Peak RSS: the median VmHWM of the runs' processes, which also host the plugin.\n\n")
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
	var changes []string
	for _, c := range []struct{ job, label string }{
		{"W3/pods=0", "random"}, {"W3/pods=1000", "random with 1,000 pods"}, {"W3/pods=0,alternating", "alternating"},
	} {
		ch := finite(r.values(c.job, "devmgr", "changed_mean"))
		if !ch.ok() {
			continue
		}
		text := fmt.Sprintf("%s %.0f", c.label, ch.med())
		if h := finite(r.values(c.job, "devmgr", "held_changed_mean")); h.ok() {
			text += fmt.Sprintf(" (%.0f of them held by a pod)", h.med())
		}
		changes = append(changes, text)
	}
	if len(changes) > 0 {
		r.p("W3, devices whose health an update changes, mean: %s.\n", strings.Join(changes, "; "))
	}
	var sizes []string
	for _, n := range []string{"8", "1000", "10000", "100000"} {
		if s := finite(r.values("W1/n="+n, "devmgr", "message_bytes")); s.ok() {
			sizes = append(sizes, fmt.Sprintf("%s devices %s", n, formatBytes(s.med())))
		}
	}
	if len(sizes) > 0 {
		r.p("ListAndWatch message sizes in W1: %s (the kubelet accepts at most 4 MiB).\n", strings.Join(sizes, ", "))
	}
	var cps []string
	for _, impl := range r.impls {
		if p, ok := r.prep[impl]; ok && p.Status == statusOK {
			cps = append(cps, impl+" "+formatValue("checkpoint_bytes", p.Metrics["checkpoint_bytes"]))
		}
	}
	if len(cps) > 0 {
		r.p("Checkpoint after 1,000 admissions: %s.\n", strings.Join(cps, ", "))
	}
	r.p("\n")
}

type verdict struct {
	target, measured string
	met              *bool // nil: not measured
}

func met(b bool) *bool { return &b }

// againstLimit prints x with three significant digits, or with as many more
// as it takes for the printed figure to fall on the same side of the limit
// as x (atMost: whether x is at most the limit, or at least it), so that a
// missed target never reads as its limit.
func againstLimit(x, limit float64, atMost bool) string {
	within := func(v float64) bool {
		if atMost {
			return v <= limit
		}
		return v >= limit
	}
	for digits := 3; digits < 8; digits++ {
		s := strconv.FormatFloat(x, 'g', digits, 64)
		if v, err := strconv.ParseFloat(s, 64); err == nil && within(v) == within(x) {
			return s
		}
	}
	return strconv.FormatFloat(x, 'g', -1, 64)
}

func (r *report) ratioTarget(name, job, metric string, limit float64) verdict {
	v := verdict{target: fmt.Sprintf("%s ≤ %gx the kubelet's", name, limit)}
	if med, lo, hi, ok := r.ratio(job, metric); ok {
		v.measured = fmt.Sprintf("%sx (per run %.3g–%.3g)", againstLimit(med, limit, true), lo, hi)
		v.met = met(med <= limit)
	} else if r.results[job] != nil {
		v.measured = "devmgr " + r.cell(job, "devmgr", metric) + "; kubelet " + r.cell(job, "kubelet", metric)
	}
	return v
}

// growth returns the median over the runs of impl's W2 last-100 mean over
// its first-100 mean, each run against itself.
func (r *report) growth(impl string) spread {
	first, last := r.values("W2", impl, "first100_mean_ns"), r.values("W2", impl, "last100_mean_ns")
	var g []float64
	for i := range min(len(first), len(last)) {
		g = append(g, last[i]/first[i])
	}
	return finite(g)
}

// verdicts judges the targets, in the order of the report.
func (r *report) verdicts() []verdict {
	var vs []verdict
	vs = append(vs, r.ratioTarget("W2 per-pod p50", "W2", "p50_ns", 0.25))

	v := verdict{target: "W2 devmgr's growth, its last 100 pods over its first 100 (means; the median of the per-run ratios), ≤ 1.25x the growth of W2's writes alone in the same runs"}
	g := r.growth("devmgr")
	f, l := finite(r.values("floorgrow", "disk", "first100_ns")), finite(r.values("floorgrow", "disk", "last100_ns"))
	if g.ok() && f.ok() && l.ok() {
		disk := l.med() / f.med()
		v.measured = fmt.Sprintf("%sx: devmgr %.3gx (per run %.3g–%.3g), the writes alone %.3gx",
			againstLimit(g.med()/disk, 1.25, true), g.med(), g.low(), g.high(), disk)
		v.met = met(g.med()/disk <= 1.25)
		if k := r.growth("kubelet"); k.ok() {
			v.measured += fmt.Sprintf("; the kubelet's %.3gx", k.med())
		}
	}
	vs = append(vs, v)

	v = r.ratioTarget("W3 0 pods, end to end, until the checkpoint is replaced", "W3/pods=0", "durable_ns", 0.8)
	if w := finite(r.values("W3wire", "wire", "visible_ns")); w.ok() && v.met != nil {
		v.measured += "; the message alone takes " + formatNs(w.med())
	}
	vs = append(vs, v)
	vs = append(vs, r.ratioTarget("W3 0 pods, through PluginListAndWatchReceiver, until it returns", "W3direct/pods=0", "call_ns", 0.7))
	vs = append(vs, r.ratioTarget("W3 1,000 pods, end to end, until the checkpoint is replaced", "W3/pods=1000", "durable_ns", 0.05))
	vs = append(vs, r.ratioTarget("W4 NewManagerImpl+Start on a 1,000-pod checkpoint", "W4", "start_ns", 0.4))
	vs = append(vs, r.ratioTarget("W6 GetTopologyHints per call", "W6", "call_ns", 0.05))
	vs = append(vs, r.ratioTarget("W1 register 10,000 devices, until visible", "W1/n=10000", "register_ns", 1.0))
	vs = append(vs, r.ratioTarget("W1 a new list of 10,000 devices, through PluginListAndWatchReceiver (the manager's own part of a registration)",
		"W1/n=10000", "first_list_ns", 0.5))

	v = verdict{target: "W1 devmgr registers and updates 100,000 devices, in every run"}
	if all := r.results["W1/n=100000"]["devmgr"]; len(all) > 0 {
		okRuns := 0
		for _, res := range all {
			if res.Status == statusOK {
				okRuns++
			}
		}
		v.measured = fmt.Sprintf("%d/%d runs correct (kubelet: %s)", okRuns, len(all), r.cell("W1/n=100000", "kubelet", "register_ns"))
		v.met = met(okRuns == len(all))
	}
	vs = append(vs, v)

	v = verdict{target: "W5 devmgr: two goroutines ≥ 1.5x one goroutine's pods/s (medians), 0 errors"}
	one, two := finite(r.values("W5/g=1", "devmgr", "pods_per_s")), finite(r.values("W5/g=2", "devmgr", "pods_per_s"))
	if one.ok() && two.ok() {
		// An error is a failed admission, a pod without its device, a device
		// held twice, or a run that did not complete.
		faults := 0
		for _, j := range []string{"W5/g=1", "W5/g=2"} {
			for _, res := range r.results[j]["devmgr"] {
				faults += int(res.Metrics["errors"] + res.Metrics["missing"] + res.Metrics["duplicates"])
				if res.Status != statusOK {
					faults++
				}
			}
		}
		v.measured = fmt.Sprintf("%sx (%.0f vs %.0f pods/s), %d errors", againstLimit(two.med()/one.med(), 1.5, false), two.med(), one.med(), faults)
		if k1, k2 := finite(r.values("W5/g=1", "kubelet", "pods_per_s")), finite(r.values("W5/g=2", "kubelet", "pods_per_s")); k1.ok() && k2.ok() {
			v.measured += fmt.Sprintf("; the kubelet's %.3gx", k2.med()/k1.med())
		} else if r.results["W5/g=2"]["kubelet"] != nil {
			v.measured += "; the kubelet's two goroutines: " + r.cell("W5/g=2", "kubelet", "pods_per_s")
		}
		v.met = met(two.med() >= 1.5*one.med() && faults == 0)
	}
	vs = append(vs, v)

	return append(vs, r.rssVerdict())
}

// rssVerdict judges peak RSS: in every workload of the results table that
// both sides completed in every run, devmgr's median peak RSS over the runs
// is at most the kubelet's median. Workloads a side did not complete are
// named, not judged.
func (r *report) rssVerdict() verdict {
	v := verdict{target: "Peak RSS of devmgr ≤ the kubelet's: in every workload of the results table that both sides complete in every run, devmgr's median over the runs ≤ the kubelet's median (the ranges, shown where it is higher, do not change the result)"}
	var worse, compared, skipped []string
	for _, j := range jobs {
		name := j.name()
		if r.results[name] == nil {
			continue
		}
		if !r.allOK(name, "devmgr") || !r.allOK(name, "kubelet") {
			skipped = append(skipped, name)
			continue
		}
		a, okA := r.rss(name, "devmgr")
		b, okB := r.rss(name, "kubelet")
		if !okA || !okB {
			skipped = append(skipped, name)
			continue
		}
		compared = append(compared, name)
		if a > b {
			worse = append(worse, fmt.Sprintf("%s: devmgr %s, kubelet %s MiB", name, r.rssSpread(name, "devmgr"), r.rssSpread(name, "kubelet")))
		}
	}
	if len(compared) == 0 {
		return v
	}
	v.met = met(len(worse) == 0)
	v.measured = fmt.Sprintf("%d workloads compared", len(compared))
	if len(worse) > 0 {
		v.measured += "; devmgr's median higher (median [min–max]) in " + strings.Join(worse, "; ")
	} else {
		v.measured += ", devmgr's median lower or equal in all"
	}
	if len(skipped) > 0 {
		v.measured += "; not compared, as a side did not complete every run: " + strings.Join(skipped, ", ")
	}
	return v
}

func (r *report) targets() {
	vs := r.verdicts()
	r.p("## Targets\n\n")
	r.p("A ratio target compares devmgr's median with the kubelet's; the per-run range is shown beside it.\n\n")
	r.p("| target | measured | result |\n|---|---|---|\n")
	n := 0
	for _, v := range vs {
		res := "not measured"
		switch {
		case v.met == nil:
		case *v.met:
			res, n = "met", n+1
		default:
			res = "**missed**"
		}
		if v.measured == "" {
			v.measured = "–"
		}
		r.p("| %s | %s | %s |\n", v.target, v.measured, res)
	}
	r.p("\n%d of %d targets met.\n\n", n, len(vs))
}

func (r *report) floors() {
	if r.results["floor"] == nil && r.results["floorgrow"] == nil && r.results["W3wire"] == nil {
		return
	}
	r.p("## Floors\n\nWhat the same disk and transport cost with no manager at all, measured in the same runs. A durable write is the textbook one: temp file, write, fsync, rename, fsync of the directory.\n\n")
	r.p("| floor | median [min–max] |\n|---|---|\n")
	if r.results["floor"] != nil {
		r.p("| one durable write of %s, the size of devmgr's checkpoint after 1,000 admissions | %s |\n",
			formatBytes(float64(r.floorLen)), r.cell("floor", "disk", "write_ns"))
	}
	for _, v := range []struct{ name, when string }{
		{"first100", "in the middle of W2's first 100 admissions"},
		{"last100", "in the middle of W2's last 100"},
	} {
		job := "floor/" + v.name
		if sizes := finite(r.values("W2", "devmgr", v.name+"_bytes")); r.results[job] != nil && sizes.ok() {
			r.p("| one durable write of %s, the checkpoint's size %s | %s |\n", formatBytes(sizes.med()), v.when, r.cell(job, "disk", "write_ns"))
		}
	}
	if r.results["floorgrow"] != nil {
		r.p("| W2's writes alone: 1,000 durable writes of a file growing in equal steps to %s, 0.5 ms apart; mean of the first 100 → of the last 100 | %s → %s |\n",
			formatBytes(finite(r.values("floorgrow", "disk", "bytes")).med()),
			r.cell("floorgrow", "disk", "first100_ns"), r.cell("floorgrow", "disk", "last100_ns"))
	}
	if r.results["W3wire"] != nil {
		r.p("| W3's message alone: plugin Update until a bare gRPC client has received the 10,000 devices | %s |\n",
			r.cell("W3wire", "wire", "visible_ns"))
	}
	r.p("\n")
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
	for _, impl := range slices.Sorted(maps.Keys(r.prep)) {
		if p := r.prep[impl]; p.Status != statusOK {
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

package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/plugintest"
)

// result is what one `bench run` prints, as one JSON line.
type result struct {
	Impl     string             `json:"impl"`
	Workload string             `json:"workload"`
	Variant  string             `json:"variant,omitempty"`
	Status   string             `json:"status"` // ok, refused, crashed, error
	Note     string             `json:"note,omitempty"`
	Metrics  map[string]float64 `json:"metrics,omitempty"`
	PeakRSS  int64              `json:"peak_rss_kib"`
	// StartRSS is the process's RSS once its packages are initialised,
	// before the workload starts.
	StartRSS int64 `json:"start_rss_kib,omitempty"`
}

const (
	statusOK      = "ok"
	statusRefused = "refused"
	statusCrashed = "crashed"
	statusError   = "error"
)

// run is the state of one workload in this process.
type run struct {
	impl    string
	dir     string
	log     logr.Logger
	sink    *errorSink
	profile string
	trace   string
	res     result
	cleanup []func()
}

// w3Devices is how many devices W3 and its message floor (W3wire) list.
const w3Devices = 10000

// settle bounds every wait for a manager to catch up.
const settle = 60 * time.Second

// afterWrite is left between a write seen on disk and the next timed step:
// the rename is visible before the writer's directory fsync (devmgr's) has
// returned, and the next message waits for it.
const afterWrite = 100 * time.Millisecond

// collectGarbage runs before each timed step that follows the run's own
// setup or a pause, so that no step pays for the setup's garbage (the
// devices and messages the run built, the previous step's): a full
// collection with its sweep, as go test does before a benchmark. Steps
// timed back to back (W2's admissions, W6's calls) get one before the
// first. Without it, whether a collection the setup made due falls inside
// a step or before it varies from run to run, and so would the step.
func collectGarbage() { runtime.GC() }

func runMain(args []string) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	impl := fs.String("impl", "devmgr", "devmgr or kubelet")
	workload := fs.String("workload", "", "W1, W2, W3, W3direct, W4prep, W4, W5, W6, floor, floorgrow or W3wire")
	dir := fs.String("dir", "", "directory for sockets and the checkpoint (on disk)")
	n := fs.Int("n", 1000, "W1: devices to register")
	pods := fs.Int("pods", 0, "W3, W3direct: pods admitted, one device each, before the updates")
	states := fs.String("states", statesRandom, "W3, W3direct: "+statesRandom+" (a fresh random tenth of the devices unhealthy on every update) or "+statesAlternating+" (the first tenth unhealthy, then none, in turn)")
	seed := fs.Uint64("seed", 1, "W3, W3direct, W3wire: seed of the random unhealthy sets (the same seed gives the same sets)")
	goroutines := fs.Int("goroutines", 1, "W5: admitting goroutines (1 or 2)")
	size := fs.Int("size", 0, "floor: bytes per write; floorgrow: the last write's size")
	iters := fs.Int("iters", 0, "W3, W3direct, W6, floor: timed repetitions (0: the workload's default)")
	profile := fs.String("cpuprofile", "", "write a CPU profile of the timed section to this file")
	traceOut := fs.String("trace", "", "write an execution trace of the timed section to this file")
	fs.BoolVar(&pinPoller, "pin", pinPoller, "pin the poller's thread to the last CPU and the others to the rest while it polls")
	fs.DurationVar(&pollInterval, "poll", pollInterval, "pause between polls of GetCapacity or the checkpoint (0: a tight loop)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" || !filepath.IsAbs(*dir) {
		return errors.New("run: -dir must be an absolute directory")
	}
	sink := &errorSink{}
	log := logr.New(sink)
	// Both managers and the plugin log through klog; this process discards
	// info messages and keeps the first errors.
	klog.SetLogger(log)

	r := &run{impl: *impl, dir: *dir, log: log, sink: sink, profile: *profile, trace: *traceOut,
		res: result{Impl: *impl, Workload: *workload, Metrics: map[string]float64{}, StartRSS: procStatusKiB("VmRSS:")}}
	var err error
	switch *workload {
	case "W1":
		r.res.Variant = fmt.Sprintf("n=%d", *n)
		err = r.w1(*n)
	case "W2":
		err = r.w2()
	case "W3", "W3direct":
		r.res.Variant = fmt.Sprintf("pods=%d", *pods)
		if *states != statesRandom {
			r.res.Variant += "," + *states
		}
		err = r.w3(*pods, orDefault(*iters, 10), *workload == "W3direct", *states, *seed)
	case "W4prep":
		err = r.w4prep()
	case "W4":
		err = r.w4()
	case "W5":
		r.res.Variant = fmt.Sprintf("g=%d", *goroutines)
		err = r.w5(*goroutines)
	case "W6":
		err = r.w6(orDefault(*iters, 200))
	case "floor":
		r.res.Impl = "disk"
		err = r.floor(*size, orDefault(*iters, 30))
	case "floorgrow":
		r.res.Impl = "disk"
		err = r.floorGrow(*size, orDefault(*iters, 1000))
	case "W3wire":
		r.res.Impl = "wire"
		err = r.w3wire(orDefault(*iters, 10), *seed)
	default:
		err = fmt.Errorf("unknown workload %q", *workload)
	}
	r.stop()
	switch {
	case errors.Is(err, errRefused):
		r.res.Status = statusRefused
		r.res.Note = r.sink.first()
	case err != nil:
		r.res.Status = statusError
		r.res.Note = joinNote(err.Error(), r.sink.first())
	default:
		r.res.Status = statusOK
	}
	r.res.PeakRSS = procStatusKiB("VmHWM:")
	return json.NewEncoder(os.Stdout).Encode(r.res)
}

func orDefault(v, d int) int {
	if v > 0 {
		return v
	}
	return d
}

func joinNote(parts ...string) string {
	var out []string
	for _, p := range parts {
		if p != "" {
			out = append(out, p)
		}
	}
	return strings.Join(out, "; ")
}

func (r *run) metric(name string, v float64)         { r.res.Metrics[name] = v }
func (r *run) duration(name string, d time.Duration) { r.metric(name, float64(d.Nanoseconds())) }
func (r *run) atExit(f func())                       { r.cleanup = append(r.cleanup, f) }

// stop runs the functions given to atExit so far, last first.
func (r *run) stop() {
	for _, f := range slices.Backward(r.cleanup) {
		f()
	}
	r.cleanup = nil
}

// startManager starts the subject with the given active pods and drains its
// Updates channel.
func (r *run) startManager(pods []*v1.Pod) (subject, error) {
	s, err := newSubject(r.impl, r.dir, r.log)
	if err != nil {
		return nil, err
	}
	list := &podList{}
	list.set(pods)
	if err := s.Start(list.get); err != nil {
		return nil, err
	}
	r.atExit(s.Stop)
	s.DrainUpdates()
	// Errors logged before now are the normal ones of a first start (the
	// kubelet logs a missing checkpoint as an error).
	r.sink.reset()
	return s, nil
}

// plugin starts and registers a plugin for res with devs, and waits until the
// manager shows every device and has finished writing its checkpoint.
func (r *run) plugin(s subject, res string, devs []*pluginapi.Device) (*plugintest.Plugin, error) {
	p, err := startPlugin(r.log, s.SocketDir(), res, devs)
	if err != nil {
		return nil, err
	}
	r.atExit(p.Stop)
	if err := p.Register(kubeletSocket(s)); err != nil {
		return nil, err
	}
	if err := waitAllocatable(s, res, int64(len(devs)), settle, nil); err != nil {
		return nil, err
	}
	return p, waitQuiet(checkpointPath(s), afterWrite, settle)
}

// startProfile starts the CPU profile and the execution trace of the timed
// section, each if asked for.
func (r *run) startProfile() (stop func(), err error) {
	var stops []func()
	stop = func() {
		for _, f := range slices.Backward(stops) {
			f()
		}
	}
	if r.profile != "" {
		f, err := os.Create(r.profile)
		if err != nil {
			return nil, err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			_ = f.Close()
			return nil, err
		}
		stops = append(stops, func() { pprof.StopCPUProfile(); _ = f.Close() })
	}
	if r.trace != "" {
		f, err := os.Create(r.trace)
		if err != nil {
			stop()
			return nil, err
		}
		if err := trace.Start(f); err != nil {
			_ = f.Close()
			stop()
			return nil, err
		}
		stops = append(stops, func() { trace.Stop(); _ = f.Close() })
	}
	return stop, nil
}

// w1 registers a plugin with n devices and times until GetCapacity shows them
// all; then one update making 10% of them unhealthy, until GetCapacity shows
// it.
func (r *run) w1(n int) error {
	s, err := r.startManager(nil)
	if err != nil {
		return err
	}
	devs := makeDevices(n)
	r.metric("message_bytes", float64(proto.Size(&pluginapi.ListAndWatchResponse{Devices: devs})))
	p, err := startPlugin(r.log, s.SocketDir(), resGPU, devs)
	if err != nil {
		return err
	}
	r.atExit(p.Stop)
	ctx, cancel := context.WithCancel(context.Background())
	r.atExit(cancel)
	refused := refusalWatch(ctx, p)
	cp := checkpointPath(s)
	before := stampOf(cp)

	stop, err := r.startProfile()
	if err != nil {
		return err
	}
	defer stop()
	collectGarbage()
	start := time.Now()
	trace.Log(context.Background(), "W1", "register")
	if err := p.Register(kubeletSocket(s)); err != nil {
		return err
	}
	if err := waitAllocatable(s, resGPU, int64(n), settle, refused); err != nil {
		return err
	}
	r.duration("register_ns", time.Since(start))
	trace.Log(context.Background(), "W1", "visible")
	if err := waitReplaced(cp, before, settle); err != nil {
		return err
	}
	r.duration("register_durable_ns", time.Since(start))
	time.Sleep(afterWrite)

	k := max(1, n/10)
	bad := make([]int, k)
	for i := range bad {
		bad[i] = i
	}
	msg := withUnhealthy(devs, bad)
	before = stampOf(cp)
	collectGarbage()
	start = time.Now()
	p.Update(msg)
	if err := waitAllocatable(s, resGPU, int64(n-k), settle, refused); err != nil {
		return err
	}
	r.duration("update_ns", time.Since(start))
	if err := waitReplaced(cp, before, settle); err != nil {
		return err
	}
	r.duration("update_durable_ns", time.Since(start))
	if c, a, _ := s.Capacity(resGPU); c != int64(n) || a != int64(n-k) {
		return fmt.Errorf("after the update: capacity %d allocatable %d, want %d and %d", c, a, n, n-k)
	}
	time.Sleep(afterWrite)

	// The manager's own part of taking a list it has never seen: n devices
	// of new IDs, as a first list is, handed to PluginListAndWatchReceiver
	// as W3direct does (no transfer, no decoding), until the call returns.
	fresh := renamed(devs, "new-")
	before = stampOf(cp)
	collectGarbage()
	start = time.Now()
	s.Receive(resGPU, fresh)
	r.duration("first_list_ns", time.Since(start))
	if c, a, _ := s.Capacity(resGPU); c != int64(n) || a != int64(n) {
		return fmt.Errorf("after the new list: capacity %d allocatable %d, want %d", c, a, n)
	}
	if st := stampOf(cp); !st.exists || st == before {
		return errors.New("the checkpoint was not rewritten before the new list's call returned")
	}
	return nil
}

// admitAll admits pods one after the other and returns each admission's
// duration. after, when not nil, is called after admission i, outside the
// timed part.
func admitAll(s subject, pods []*v1.Pod, after func(i int)) (durations, error) {
	out := make(durations, 0, len(pods))
	ctx := context.Background()
	for i, pod := range pods {
		start := time.Now()
		if err := s.Allocate(ctx, pod, &pod.Spec.Containers[0]); err != nil {
			return out, fmt.Errorf("admit %s: %w", pod.Name, err)
		}
		out = append(out, time.Since(start))
		if after != nil {
			after(i)
		}
	}
	return out, nil
}

func makePods(n int, res string) []*v1.Pod {
	pods := make([]*v1.Pod, n)
	for i := range pods {
		pods[i] = makePod(i, res, 1)
	}
	return pods
}

// checkAllocations checks that every pod holds exactly one device of its
// resource and that no device is held twice; it returns the devices held.
func checkAllocations(s subject, pods []*v1.Pod) (held []string, missing, duplicates int) {
	seen := map[string]bool{}
	for _, pod := range pods {
		var res string
		for name := range pod.Spec.Containers[0].Resources.Limits {
			res = string(name)
		}
		ids := s.Devices(string(pod.UID), "app", res)
		if len(ids) != 1 {
			missing++
		}
		for _, id := range ids {
			key := res + "/" + id
			if seen[key] {
				duplicates++
			}
			seen[key] = true
			held = append(held, id)
		}
	}
	return held, missing, duplicates
}

// gpuNode starts a manager that knows n pods asking for one GPU each, and a
// plugin with n GPUs, for W2 and W4's preparation.
func (r *run) gpuNode(n int) (subject, []*v1.Pod, error) {
	pods := makePods(n, resGPU)
	s, err := r.startManager(pods)
	if err != nil {
		return nil, nil, err
	}
	if _, err := r.plugin(s, resGPU, makeDevices(n)); err != nil {
		return nil, nil, err
	}
	return s, pods, nil
}

// w2 admits 1,000 pods of one device each, on 1,000 devices, one after the
// other.
func (r *run) w2() error {
	const n = 1000
	s, pods, err := r.gpuNode(n)
	if err != nil {
		return err
	}
	stop, err := r.startProfile()
	if err != nil {
		return err
	}
	// The checkpoint's size in the middle of the first and of the last 100
	// admissions: the driver times the disk alone on files of those sizes.
	var sizeFirst, sizeLast int64
	collectGarbage()
	start := time.Now()
	d, err := admitAll(s, pods, func(i int) {
		switch i {
		case 49:
			sizeFirst = stampOf(checkpointPath(s)).size
		case n - 51:
			sizeLast = stampOf(checkpointPath(s)).size
		}
	})
	total := time.Since(start)
	stop()
	if err != nil {
		return err
	}
	r.duration("total_ns", total)
	r.duration("p50_ns", d.quantile(0.50))
	r.duration("p99_ns", d.quantile(0.99))
	r.duration("max_ns", d.quantile(1))
	r.duration("first100_mean_ns", d[:100].mean())
	r.duration("last100_mean_ns", d[n-100:].mean())
	r.metric("checkpoint_bytes", float64(stampOf(checkpointPath(s)).size))
	r.metric("first100_bytes", float64(sizeFirst))
	r.metric("last100_bytes", float64(sizeLast))
	if _, missing, dup := checkAllocations(s, pods); missing+dup > 0 {
		return fmt.Errorf("%d pods without their device, %d devices held twice", missing, dup)
	}
	return nil
}

// W3's update sequences (-states).
const (
	statesRandom      = "random"
	statesAlternating = "alternating"
)

// unhealthySets returns, for each of iters updates of n devices, the
// indexes of the devices that update marks unhealthy; every other device is
// healthy in it.
//
// random: a fresh random tenth of the devices on every update, drawn from a
// generator seeded with seed, so that both implementations get the same
// sequence for one seed and no state of a run comes back: a manager cannot
// gain by remembering an earlier state. Every other update marks 900 in 1,000
// (of 10,000) instead, so that allocatable changes with every update and a
// poll of GetCapacity sees each one.
//
// alternating: the first tenth, then none, in turn; two states only.
func unhealthySets(n, iters int, states string, seed uint64) ([][]int, error) {
	tenth := n / 10
	out := make([][]int, iters)
	switch states {
	case statesAlternating:
		first := make([]int, tenth)
		for i := range first {
			first[i] = i
		}
		for u := range out {
			if u%2 == 0 {
				out[u] = first
			}
		}
	case statesRandom:
		rng := rand.New(rand.NewPCG(seed, 0x57a7e5))
		perm := make([]int, n)
		for i := range perm {
			perm[i] = i
		}
		for u := range out {
			k := tenth
			if u%2 == 1 {
				k -= tenth / 10
			}
			// A partial Fisher–Yates shuffle: perm[:k] is a uniformly
			// random k-subset, whatever order perm was in.
			for i := range k {
				j := i + rng.IntN(n-i)
				perm[i], perm[j] = perm[j], perm[i]
			}
			out[u] = slices.Sorted(slices.Values(perm[:k]))
		}
	default:
		return nil, fmt.Errorf("unknown -states %q (want %s or %s)", states, statesRandom, statesAlternating)
	}
	return out, nil
}

// healthChanges returns, for the updates of sets applied one after the
// other to devices all healthy at first, the mean number of devices whose
// health each update changes, and of those the mean number that are in held.
func healthChanges(devs []*pluginapi.Device, sets [][]int, held map[string]bool) (changed, heldChanged float64) {
	prev := map[int]bool{}
	for _, set := range sets {
		cur := make(map[int]bool, len(set))
		for _, i := range set {
			cur[i] = true
		}
		for _, m := range []struct{ a, b map[int]bool }{{cur, prev}, {prev, cur}} {
			for i := range m.a {
				if !m.b[i] {
					changed++
					if held[devs[i].ID] {
						heldChanged++
					}
				}
			}
		}
		prev = cur
	}
	if len(sets) == 0 {
		return 0, 0
	}
	return changed / float64(len(sets)), heldChanged / float64(len(sets))
}

// w3 sends ListAndWatch messages of 10,000 devices, each marking the
// devices of one of unhealthySets unhealthy, with npods pods (one device
// each) admitted first, and times until GetCapacity shows the new
// allocatable (visible) and until the checkpoint file has been replaced
// (durable). The held devices get no special treatment: each update draws
// from all 10,000, so it reaches about as many held devices as their share.
//
// direct hands the same messages to the manager's PluginListAndWatchReceiver
// instead, as the plugin client does once it has received one, and times the
// call (call_ns): the manager's own work, with no plugin and no gRPC. Both
// implementations apply the list and write the checkpoint before the call
// returns; the run checks that they did.
func (r *run) w3(npods, iters int, direct bool, states string, seed uint64) error {
	const n = w3Devices
	sets, err := unhealthySets(n, iters, states, seed)
	if err != nil {
		return err
	}
	pods := makePods(npods, resGPU)
	s, err := r.startManager(pods)
	if err != nil {
		return err
	}
	devs := makeDevices(n)
	p, err := r.plugin(s, resGPU, devs)
	if err != nil {
		return err
	}
	var held map[string]bool
	if npods > 0 {
		if _, err := admitAll(s, pods, nil); err != nil {
			return err
		}
		ids, missing, dup := checkAllocations(s, pods)
		if missing+dup > 0 {
			return fmt.Errorf("%d pods without their device, %d devices held twice", missing, dup)
		}
		held = idSet(ids)
	}
	changed, heldChanged := healthChanges(devs, sets, held)
	r.metric("unhealthy", float64(len(sets[0])))
	r.metric("changed_mean", changed)
	if npods > 0 {
		r.metric("held_changed_mean", heldChanged)
	}
	if direct {
		return r.w3direct(s, devs, sets)
	}
	cp := checkpointPath(s)
	var visible, durable durations
	stop, err := r.startProfile()
	if err != nil {
		return err
	}
	defer stop()
	for _, set := range sets {
		// Each message is built outside the timed step, as the plugin's
		// own list would be.
		msg := withUnhealthy(devs, set)
		before := stampOf(cp)
		collectGarbage()
		start := time.Now()
		trace.Log(context.Background(), "W3", "update")
		p.Update(msg)
		if err := waitAllocatable(s, resGPU, int64(n-len(set)), settle, nil); err != nil {
			return err
		}
		visible = append(visible, time.Since(start))
		trace.Log(context.Background(), "W3", "visible")
		if err := waitReplaced(cp, before, settle); err != nil {
			return err
		}
		durable = append(durable, time.Since(start))
		time.Sleep(afterWrite)
	}
	r.duration("visible_ns", median(visible))
	r.duration("visible_min_ns", visible.quantile(0))
	r.duration("durable_ns", median(durable))
	return nil
}

func idSet(ids []string) map[string]bool {
	out := make(map[string]bool, len(ids))
	for _, id := range ids {
		out[id] = true
	}
	return out
}

// w3direct is W3's loop through PluginListAndWatchReceiver. Each message is
// built afresh outside the timed call, as a gRPC client decodes each one.
func (r *run) w3direct(s subject, devs []*pluginapi.Device, sets [][]int) error {
	cp := checkpointPath(s)
	var call durations
	stop, err := r.startProfile()
	if err != nil {
		return err
	}
	defer stop()
	for _, set := range sets {
		msg := withUnhealthy(devs, set)
		want := int64(len(devs) - len(set))
		before := stampOf(cp)
		collectGarbage()
		start := time.Now()
		s.Receive(resGPU, msg)
		call = append(call, time.Since(start))
		if _, a, _ := s.Capacity(resGPU); a != want {
			return fmt.Errorf("allocatable %d after the call, want %d", a, want)
		}
		if st := stampOf(cp); !st.exists || st == before {
			return errors.New("the checkpoint was not rewritten before the call returned")
		}
		time.Sleep(afterWrite)
	}
	r.duration("call_ns", median(call))
	r.duration("call_min_ns", call.quantile(0))
	return nil
}

// w4prep leaves, in the run's directory, the checkpoint of 1,000 pods
// admitted on 1,000 devices by this implementation.
func (r *run) w4prep() error {
	const n = 1000
	s, pods, err := r.gpuNode(n)
	if err != nil {
		return err
	}
	if _, err := admitAll(s, pods, nil); err != nil {
		return err
	}
	r.metric("checkpoint_bytes", float64(stampOf(checkpointPath(s)).size))
	return nil
}

// w4 times NewManagerImpl and Start on the checkpoint w4prep left, until
// GetCapacity answers with the restored resource.
func (r *run) w4() error {
	const n = 1000
	pods := makePods(n, resGPU)
	s, err := newSubject(r.impl, r.dir, r.log)
	if err != nil {
		return err
	}
	list := &podList{}
	list.set(pods)
	collectGarbage()
	start := time.Now()
	err = s.Start(list.get)
	if err == nil {
		if _, _, listed := s.Capacity(resGPU); !listed {
			err = errors.New("the restored resource is missing from GetCapacity")
		}
	}
	elapsed := time.Since(start)
	r.atExit(s.Stop)
	if err != nil {
		return err
	}
	r.duration("start_ns", elapsed)
	restored := 0
	for _, pod := range pods {
		if len(s.Devices(string(pod.UID), "app", resGPU)) == 1 {
			restored++
		}
	}
	r.metric("restored_pods", float64(restored))
	if restored != n {
		return fmt.Errorf("restored %d of %d pods", restored, n)
	}
	return nil
}

// w5 admits 500 pods of resource A and 500 of resource B (500 devices each),
// from one goroutine (alternating A and B) or from two (one per resource).
func (r *run) w5(goroutines int) error {
	const perRes = 500
	podsA, podsB := make([]*v1.Pod, perRes), make([]*v1.Pod, perRes)
	for i := range perRes {
		podsA[i] = makePod(i, resA, 1)
		podsB[i] = makePod(perRes+i, resB, 1)
	}
	all := append(slices.Clone(podsA), podsB...)
	s, err := r.startManager(all)
	if err != nil {
		return err
	}
	if _, err := r.plugin(s, resA, makeDevices(perRes)); err != nil {
		return err
	}
	if _, err := r.plugin(s, resB, makeDevices(perRes)); err != nil {
		return err
	}
	var lanes [][]*v1.Pod
	switch goroutines {
	case 1:
		lane := make([]*v1.Pod, 0, 2*perRes)
		for i := range perRes {
			lane = append(lane, podsA[i], podsB[i])
		}
		lanes = [][]*v1.Pod{lane}
	case 2:
		lanes = [][]*v1.Pod{podsA, podsB}
	default:
		return fmt.Errorf("goroutines must be 1 or 2, not %d", goroutines)
	}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		errs   int
		first  error
		begin  = make(chan struct{})
		ctx    = context.Background()
		record = func(err error) {
			mu.Lock()
			defer mu.Unlock()
			errs++
			if first == nil {
				first = err
			}
		}
	)
	for _, lane := range lanes {
		wg.Go(func() {
			<-begin
			for _, pod := range lane {
				if err := s.Allocate(ctx, pod, &pod.Spec.Containers[0]); err != nil {
					record(fmt.Errorf("admit %s: %w", pod.Name, err))
				}
			}
		})
	}
	stop, err := r.startProfile()
	if err != nil {
		return err
	}
	collectGarbage()
	start := time.Now()
	close(begin)
	wg.Wait()
	elapsed := time.Since(start)
	stop()
	r.duration("wall_ns", elapsed)
	r.metric("pods_per_s", float64(len(all))/elapsed.Seconds())
	r.metric("errors", float64(errs))
	_, missing, dup := checkAllocations(s, all)
	r.metric("missing", float64(missing))
	r.metric("duplicates", float64(dup))
	if first != nil {
		r.res.Note = first.Error()
	}
	return nil
}

// w6 times GetTopologyHints for a container asking for one of 10,000 devices
// spread over 2 NUMA nodes.
func (r *run) w6(iters int) error {
	const n = 10000
	pod := makePod(0, resGPU, 1)
	s, err := r.startManager([]*v1.Pod{pod})
	if err != nil {
		return err
	}
	if _, err := r.plugin(s, resGPU, makeDevices(n)); err != nil {
		return err
	}
	c := &pod.Spec.Containers[0]
	hints := 0
	for range 5 {
		hints = s.Hints(pod, c, resGPU)
	}
	d := make(durations, 0, iters)
	stop, err := r.startProfile()
	if err != nil {
		return err
	}
	defer stop()
	collectGarbage()
	for range iters {
		start := time.Now()
		s.Hints(pod, c, resGPU)
		d = append(d, time.Since(start))
	}
	r.duration("call_ns", median(d))
	r.duration("call_min_ns", d.quantile(0))
	r.metric("hints", float64(hints))
	if hints != 3 {
		return fmt.Errorf("got %d hints, want 3 ({0}, {1} preferred; {0,1})", hints)
	}
	return nil
}

// w3wire is W3's transport alone: the same 10,000-device messages (the
// random sequence of seed) from the same plugin to a bare gRPC client, timed
// from Update until the client has received and counted the message. No
// manager can report an update sooner.
func (r *run) w3wire(iters int, seed uint64) error {
	const n = w3Devices
	sets, err := unhealthySets(n, iters, statesRandom, seed)
	if err != nil {
		return err
	}
	devs := makeDevices(n)
	p, err := startPlugin(r.log, r.dir, resGPU, devs)
	if err != nil {
		return err
	}
	r.atExit(p.Stop)
	conn, err := grpc.NewClient("unix://"+p.SocketPath(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		return err
	}
	r.atExit(func() { _ = conn.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	r.atExit(cancel)
	stream, err := pluginapi.NewDevicePluginClient(conn).ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		return err
	}
	healthy := func() (int, error) {
		msg, err := stream.Recv()
		if err != nil {
			return 0, err
		}
		k := 0
		for _, d := range msg.GetDevices() {
			if d.GetHealth() == pluginapi.Healthy {
				k++
			}
		}
		return k, nil
	}
	if _, err := healthy(); err != nil {
		return err
	}
	var d durations
	for _, set := range sets {
		msg := withUnhealthy(devs, set)
		collectGarbage()
		start := time.Now()
		p.Update(msg)
		k, err := healthy()
		if err != nil {
			return err
		}
		d = append(d, time.Since(start))
		if k != n-len(set) {
			return fmt.Errorf("received %d healthy devices, want %d", k, n-len(set))
		}
		time.Sleep(afterWrite)
	}
	r.duration("visible_ns", median(d))
	return nil
}

// floor times the durable write of a file of size bytes on the run's disk
// (temp file, write, fsync, rename, fsync of the directory): the least a
// checkpointed admission can cost.
func (r *run) floor(size, iters int) error {
	if size <= 0 {
		return errors.New("floor: -size must be positive")
	}
	blob := make([]byte, size)
	for i := range blob {
		blob[i] = "0123456789abcdef"[i%16]
	}
	d := make(durations, 0, iters)
	for range iters {
		start := time.Now()
		if err := durableWrite(r.dir, checkpointName, blob); err != nil {
			return err
		}
		d = append(d, time.Since(start))
		blob[0] ^= 1
	}
	r.duration("write_ns", median(d))
	r.duration("write_min_ns", d.quantile(0))
	r.metric("bytes", float64(size))
	return nil
}

// floorGrow times the disk alone on W2's sequence of writes: iters durable
// writes of a file growing in equal steps up to size bytes, as the
// checkpoint grows with each admission, with a pause between writes about as
// long as an admission's other work. It reports the mean of the first and of
// the last 100 writes: what W2's first and last 100 admissions would cost if
// the disk write were all there was.
func (r *run) floorGrow(size, iters int) error {
	if size <= 0 || iters < 200 {
		return errors.New("floorgrow: -size must be positive and -iters at least 200")
	}
	blob := make([]byte, size)
	for i := range blob {
		blob[i] = "0123456789abcdef"[i%16]
	}
	step := size / iters
	d := make(durations, 0, iters)
	for i := range iters {
		n := (i + 1) * step
		blob[i%n] ^= 1 // the content changes, as a new entry's does
		start := time.Now()
		if err := durableWrite(r.dir, checkpointName, blob[:n]); err != nil {
			return err
		}
		d = append(d, time.Since(start))
		time.Sleep(500 * time.Microsecond)
	}
	r.duration("first100_ns", d[:100].mean())
	r.duration("last100_ns", d[iters-100:].mean())
	r.metric("bytes", float64(size))
	return nil
}

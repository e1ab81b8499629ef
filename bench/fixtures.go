package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/plugintest"
)

// Resource names the workloads use.
const (
	resGPU = "example.com/gpu"
	resA   = "example.com/gpu-a"
	resB   = "example.com/gpu-b"
)

// numaNodes is the machine topology given to both managers in every workload.
var numaNodes = []int{0, 1}

// deviceID returns the i-th device ID: 40 bytes, shaped like the UUIDs GPU
// plugins advertise, so that message and checkpoint sizes are realistic.
func deviceID(i int) string {
	return fmt.Sprintf("GPU-%08x-%04x-4%03x-8%03x-%012x",
		uint32(i)*2654435761, i&0xffff, i%4096, (i/7)%4096, i)
}

// makeDevices returns n healthy devices alternating between NUMA nodes 0 and 1.
func makeDevices(n int) []*pluginapi.Device {
	out := make([]*pluginapi.Device, n)
	for i := range out {
		out[i] = &pluginapi.Device{
			ID:       deviceID(i),
			Health:   pluginapi.Healthy,
			Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(i % len(numaNodes))}}},
		}
	}
	return out
}

// renamed returns a copy of devs, healthy, each ID prefixed: a list of
// devices none of which a manager that took devs has seen.
func renamed(devs []*pluginapi.Device, prefix string) []*pluginapi.Device {
	out := make([]*pluginapi.Device, len(devs))
	for i, d := range devs {
		out[i] = &pluginapi.Device{ID: prefix + d.ID, Health: pluginapi.Healthy, Topology: d.Topology}
	}
	return out
}

// withUnhealthy returns a copy of devs in which the devices at the indexes
// in bad are unhealthy and every other device is healthy.
func withUnhealthy(devs []*pluginapi.Device, bad []int) []*pluginapi.Device {
	out := make([]*pluginapi.Device, len(devs))
	for i, d := range devs {
		out[i] = &pluginapi.Device{ID: d.ID, Health: pluginapi.Healthy, Topology: d.Topology}
	}
	for _, i := range bad {
		out[i].Health = pluginapi.Unhealthy
	}
	return out
}

// makePod returns a pod with one container "app" asking for n devices of res.
func makePod(i int, res string, n int64) *v1.Pod {
	q := *resource.NewQuantity(n, resource.DecimalSI)
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      fmt.Sprintf("pod-%05d", i),
			Namespace: "bench",
			UID:       podUID(i),
		},
		Spec: v1.PodSpec{Containers: []v1.Container{{
			Name: "app",
			Resources: v1.ResourceRequirements{
				Limits:   v1.ResourceList{v1.ResourceName(res): q},
				Requests: v1.ResourceList{v1.ResourceName(res): q},
			},
		}}},
	}
}

// podUID returns the i-th pod's UID: a version-4 UUID, unique per i and in
// no particular order, as the API server assigns them, so that no
// implementation gains from UIDs that arrive sorted.
func podUID(i int) types.UID {
	a, b := mix64(uint64(i)*2+1), mix64(uint64(i)*2+2)
	return types.UID(fmt.Sprintf("%08x-%04x-4%03x-%04x-%012x",
		a>>32, (a>>16)&0xffff, a&0xfff, 0x8000|(b>>48)&0x3fff, b&0xffffffffffff))
}

// mix64 is the splitmix64 finaliser.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// podList is the active-pod list handed to a manager.
type podList struct {
	mu   sync.Mutex
	pods []*v1.Pod
}

func (l *podList) set(pods []*v1.Pod) {
	l.mu.Lock()
	l.pods = pods
	l.mu.Unlock()
}

func (l *podList) get() []*v1.Pod {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pods
}

// errorSink is the logr sink of a run: it drops every info message (both
// managers then skip formatting) and keeps the first error messages, which
// explain a refusal or a failure.
type errorSink struct {
	mu   sync.Mutex
	errs []string
}

func (s *errorSink) Init(logr.RuntimeInfo)    {}
func (s *errorSink) Enabled(int) bool         { return false }
func (s *errorSink) Info(int, string, ...any) {}
func (s *errorSink) Error(err error, msg string, _ ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.errs) < 8 {
		s.errs = append(s.errs, fmt.Sprintf("%s: %v", msg, err))
	}
}
func (s *errorSink) WithValues(...any) logr.LogSink { return s }
func (s *errorSink) WithName(string) logr.LogSink   { return s }

func (s *errorSink) reset() {
	s.mu.Lock()
	s.errs = nil
	s.mu.Unlock()
}

func (s *errorSink) first() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.errs, "; ")
}

// startPlugin starts a plugintest plugin for res in dir with devs.
func startPlugin(log logr.Logger, dir, res string, devs []*pluginapi.Device) (*plugintest.Plugin, error) {
	p, err := plugintest.New(plugintest.Options{
		ResourceName: res,
		SocketDir:    dir,
		Devices:      devs,
		Logger:       log,
	})
	if err != nil {
		return nil, err
	}
	if err := p.Start(); err != nil {
		return nil, err
	}
	return p, nil
}

// refusalWatch reports, once the plugin's first ListAndWatch stream has been
// opened and then ended, that the manager dropped the stream (the kubelet
// does so for a message over its 4 MiB receive limit).
func refusalWatch(ctx context.Context, p *plugintest.Plugin) *atomic.Bool {
	var ended atomic.Bool
	go func() {
		if _, err := p.WaitForCalls(ctx, plugintest.MethodListAndWatch, 1); err != nil {
			return
		}
		t := time.NewTicker(2 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if p.Streams() == 0 {
					ended.Store(true)
					return
				}
			}
		}
	}()
	return &ended
}

var (
	errTimeout = errors.New("timed out")
	errRefused = errors.New("the manager ended the plugin's ListAndWatch stream")
)

// pollInterval is the pause between two polls of GetCapacity or of the
// checkpoint file. A pause is a nanosleep on a thread of the poller's own
// with a timer slack of 1 ns: the poller takes little CPU and never sits in
// the Go scheduler's queues (it keeps its P, as sysmon does not hand off
// system calls this short). 0 polls in a tight loop instead, yielding the
// processor between polls; on a machine of few CPUs that loop keeps one
// busy, waits in the global run queue while the manager's goroutine runs
// on, and starves the runtime's network poller, so that a manager's new
// state is often seen only once it blocks in its checkpoint write.
// time.Sleep is no use here: it rounds short pauses up to about a
// millisecond.
var pollInterval = 10 * time.Microsecond

// startPolling returns what to call between two polls, and what to call
// when polling is over.
func startPolling() (pause, stop func()) {
	if pollInterval <= 0 {
		return runtime.Gosched, func() {}
	}
	runtime.LockOSThread()
	slack := unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0) == nil
	ts := unix.NsecToTimespec(pollInterval.Nanoseconds())
	var all unix.CPUSet
	pinned := false
	if pinPoller {
		all, pinned = pinThreads(unix.Gettid())
	}
	return func() { _ = unix.Nanosleep(&ts, nil) }, func() {
		if pinned {
			unpinThreads(all)
		}
		if slack {
			_ = unix.Prctl(unix.PR_SET_TIMERSLACK, 0, 0, 0, 0) // the thread's default again
		}
		runtime.UnlockOSThread()
	}
}

// pinPoller: while it polls, the poller's thread has a CPU of its own and
// every other thread of the process the others (see pinThreads).
var pinPoller = true

// pinThreads puts the calling thread, the poller's, on the last CPU the
// process may use and every other thread of the process on the others, and
// returns the set to give them all back when the poll ends; ok is false
// when there is one CPU or the sets cannot be read. A kernel that does not
// balance threads between CPUs may leave a manager thread on the CPU of the
// poller's frequent wakeups, slowing it in some runs and not others, or the
// poller's wakeup behind the manager's thread while another CPU idles.
// Threads created while the poll lasts inherit the set of the thread that
// creates them.
func pinThreads(poller int) (all unix.CPUSet, ok bool) {
	if err := unix.SchedGetaffinity(0, &all); err != nil || all.Count() < 2 {
		return all, false
	}
	last := -1
	for c, left := 0, all.Count(); left > 0; c++ {
		if all.IsSet(c) {
			last, left = c, left-1
		}
	}
	var mine unix.CPUSet
	mine.Set(last)
	if unix.SchedSetaffinity(0, &mine) != nil {
		return all, false
	}
	rest := all
	rest.Clear(last)
	for _, tid := range threads() {
		if tid != poller {
			_ = unix.SchedSetaffinity(tid, &rest) // a thread may have exited
		}
	}
	return all, true
}

// unpinThreads lets every thread of the process run on the CPUs of all.
func unpinThreads(all unix.CPUSet) {
	for _, tid := range threads() {
		_ = unix.SchedSetaffinity(tid, &all)
	}
}

// threads returns the IDs of the process's threads.
func threads() []int {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil
	}
	var out []int
	for _, t := range tasks {
		if tid, err := strconv.Atoi(t.Name()); err == nil {
			out = append(out, tid)
		}
	}
	return out
}

// waitAllocatable polls the manager until res shows want allocatable devices.
// refused, when not nil, ends the wait early.
func waitAllocatable(s subject, res string, want int64, timeout time.Duration, refused *atomic.Bool) error {
	pause, stop := startPolling()
	defer stop()
	deadline := time.Now().Add(timeout)
	for i := 0; ; i++ {
		if _, a, ok := s.Capacity(res); ok && a == want {
			return nil
		}
		if refused != nil && refused.Load() {
			return errRefused
		}
		if i%64 == 0 && time.Now().After(deadline) {
			return fmt.Errorf("allocatable %s never reached %d: %w", res, want, errTimeout)
		}
		pause()
	}
}

// fileStamp identifies one version of a file replaced by rename.
type fileStamp struct {
	exists bool
	ino    uint64
	ctime  int64
	size   int64
}

func stampOf(path string) fileStamp {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return fileStamp{}
	}
	return fileStamp{exists: true, ino: st.Ino, ctime: st.Ctim.Nano(), size: st.Size}
}

// waitReplaced polls until the file at path is no longer the version old.
func waitReplaced(path string, old fileStamp, timeout time.Duration) error {
	pause, stop := startPolling()
	defer stop()
	deadline := time.Now().Add(timeout)
	for i := 0; ; i++ {
		if st := stampOf(path); st.exists && st != old {
			return nil
		}
		if i%64 == 0 && time.Now().After(deadline) {
			return fmt.Errorf("%s was not rewritten: %w", path, errTimeout)
		}
		pause()
	}
}

// waitQuiet waits until the file at path exists and has not changed for
// quiet: the manager has finished the writes a registration set off.
func waitQuiet(path string, quiet, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	last := stampOf(path)
	since := time.Now()
	for {
		time.Sleep(5 * time.Millisecond)
		st := stampOf(path)
		if st != last {
			last, since = st, time.Now()
		} else if st.exists && time.Since(since) >= quiet {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not settle: %w", path, errTimeout)
		}
	}
}

// durableWrite writes blob to dir/name the way a crash-safe store does:
// temp file, fsync, rename, fsync of the directory.
func durableWrite(dir, name string, blob []byte) error {
	f, err := os.CreateTemp(dir, ".floor")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(blob)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, name))
	}
	if err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return syncDir(dir)
}

// syncDir makes dir's entries (a rename) durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// procStatusKiB returns the field of /proc/self/status named by prefix
// ("VmHWM:", the peak RSS; "VmRSS:", the RSS now), in KiB.
func procStatusKiB(prefix string) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

// durations summarises samples.
type durations []time.Duration

func (d durations) sorted() durations {
	s := slices.Clone(d)
	slices.Sort(s)
	return s
}

// quantile returns the q-quantile (nearest rank) of d.
func (d durations) quantile(q float64) time.Duration {
	s := d.sorted()
	if len(s) == 0 {
		return 0
	}
	i := int(q*float64(len(s))+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}

func (d durations) mean() time.Duration {
	if len(d) == 0 {
		return 0
	}
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	return sum / time.Duration(len(d))
}

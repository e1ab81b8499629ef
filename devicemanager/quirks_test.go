package devicemanager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/checkpoint"
	"github.com/openkubelet/devmgr/endpoint"
	"github.com/openkubelet/devmgr/internal/fdcheck"
	"github.com/openkubelet/devmgr/internal/leakwait"
	"github.com/openkubelet/devmgr/plugintest"
)

// Quirks of real device plugins, mimicked with plugintest. For each one:
// registration either succeeds or fails with a clear error; nothing leaks
// (no goroutine and no file descriptor the quirky plugin made the manager
// open outlives it: see leakCheck); and the manager keeps serving a
// well-behaved plugin registered alongside (see bystander).

// leakCheck remembers the goroutines and open file descriptors of the process
// at one moment, to check later that whatever started since has ended. The
// package has no parallel tests, so nothing else runs meanwhile; what an
// earlier test started and is still winding down may end in between, which
// is why the file descriptor check is "no more than before" rather than
// "exactly as many": there is no slack for growth.
type leakCheck struct {
	t          *testing.T
	fds        map[string]string // /proc/self/fd entry -> link target
	goroutines goleak.Option
}

func newLeakCheck(t *testing.T) *leakCheck {
	t.Helper()
	return &leakCheck{t: t, fds: fdcheck.Snapshot(t), goroutines: goleak.IgnoreCurrent()}
}

// verify waits until the process holds no more file descriptors than at the
// snapshot and every goroutine started since the snapshot has ended, and
// fails the test with what is left when that does not happen in waitTimeout.
// Call it once everything the case started is stopped.
func (l *leakCheck) verify() {
	l.t.Helper()
	var now map[string]string
	if !assert.Eventually(l.t, func() bool {
		now = fdcheck.Snapshot(l.t)
		return len(now) <= len(l.fds)
	}, waitTimeout, 5*time.Millisecond) {
		l.t.Errorf("file descriptors leaked: %d at the snapshot, %d now; new: %v",
			len(l.fds), len(now), fdcheck.New(l.fds, now))
	}
	leakwait.VerifyNone(l.t, waitTimeout, l.goroutines)
}

// resBystander is the resource of the well-behaved plugin.
const resBystander = "example.com/bystander"

// bystanderPods numbers the bystander's pods across the whole test binary,
// so that a bystander registered again after a restart names new pods.
var bystanderPods atomic.Int64

// bystander is a well-behaved plugin registered next to a quirky one: the
// manager must keep serving it.
type bystander struct {
	h *harness
	p *plugintest.Plugin
}

// bystander starts and registers a well-behaved plugin with 64 devices.
func (h *harness) bystander() *bystander {
	h.t.Helper()
	return &bystander{h: h, p: h.registered(resBystander, devices("by", 64), endpointName("bystander.sock"))}
}

// admit admits a new pod asking one device of the bystander's resource and
// checks that it got one, through the bystander's Allocate.
func (b *bystander) admit() {
	b.h.t.Helper()
	pod := newPod(fmt.Sprintf("bystander-%d", bystanderPods.Add(1)), ctr("c", resBystander, 1))
	b.h.pods.add(pod)
	calls := len(b.p.CallsOf(plugintest.MethodAllocate))
	require.NoError(b.h.t, b.h.admit(pod), "the manager still serves the well-behaved plugin")
	assert.Len(b.h.t, b.h.held(pod, "c", resBystander), 1)
	assert.Len(b.h.t, b.p.CallsOf(plugintest.MethodAllocate), calls+1)
}

// holdCheckpointWrites takes the checkpoint write lock until the returned
// function (idempotent; also run at cleanup, before the manager stops) is
// called. A ListAndWatch message that changes the checkpoint's content
// (the first one of a resource always does) is applied and then waits for
// its write, so the stream's next message cannot be applied meanwhile: a
// test can observe the state between two messages without racing. Admitting
// a pod would wait too, so a test must not admit while it holds the lock.
func (h *harness) holdCheckpointWrites() (release func()) {
	h.m.writer.mu.Lock()
	var once sync.Once
	release = func() { once.Do(h.m.writer.mu.Unlock) }
	h.t.Cleanup(release)
	return release
}

// connections returns the number of connected plugin instances of res.
func (h *harness) connections(res string) int {
	h.m.mu.Lock()
	defer h.m.mu.Unlock()
	if r := h.m.core.resources[res]; r != nil {
		return len(r.instances)
	}
	return 0
}

// registerErr registers p within waitTimeout and returns the gRPC status
// error the manager answered (nil on success).
func (h *harness) registerErr(p *plugintest.Plugin) error {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	err := p.RegisterWith(ctx, h.kubeletSocket(), p.RegisterRequest())
	if err == nil {
		return nil
	}
	return errors.Unwrap(err)
}

// Quirk: a plugin's first ListAndWatch message lists no devices and the real
// list follows at once (some plugins open the stream before they have probed
// their hardware). The resource appears with capacity 0, then with its
// devices; on a plugin restart the empty message makes nothing allocatable
// for a moment but loses no allocation.
func TestQuirkEmptyFirstListAndWatchMessage(t *testing.T) {
	h := newHarness(t).start()
	by := h.bystander()
	leaks := newLeakCheck(t)
	emptyFirst := func(o *plugintest.Options) { o.EmptyFirstMessage = true }

	p := h.plugin(res1, devices("gpu", 3), emptyFirst)
	release := h.holdCheckpointWrites()
	require.NoError(t, p.Register(h.kubeletSocket()))
	h.waitCapacity(res1, 0, 0)
	all := h.m.GetAllocatableDevices()
	require.Contains(t, all, res1, "a plugin that listed no devices is registered")
	assert.Empty(t, all[res1])
	release()
	h.waitCapacity(res1, 3, 3)

	a := newPod("a", ctr("c", res1, 1))
	h.pods.add(a)
	require.NoError(t, h.admit(a))
	held := h.held(a, "c", res1)
	require.Len(t, held, 1)

	// The plugin restarts on its socket and again starts with an empty list
	// while pod a holds one of its devices.
	restarted := h.plugin(res1, devices("gpu", 3), emptyFirst)
	release = h.holdCheckpointWrites()
	require.NoError(t, restarted.Register(h.kubeletSocket()))
	h.waitCapacity(res1, 0, 0)
	assert.Equal(t, held, h.held(a, "c", res1), "an empty list takes no allocation away")
	release()
	h.waitCapacity(res1, 3, 3)

	assert.Equal(t, held, h.held(a, "c", res1))
	greedy := newPod("greedy", ctr("c", res1, 3))
	h.pods.add(greedy)
	err := h.admit(greedy)
	require.ErrorIs(t, err, ErrInsufficientDevices)
	assert.EqualError(t, err, "requested number of devices unavailable for "+res1+". Requested: 3, Available: 2")
	b := newPod("b", ctr("c", res1, 2))
	h.pods.add(b)
	require.NoError(t, h.admit(b))
	assert.Len(t, h.held(b, "c", res1), 2)
	assert.NotContains(t, h.held(b, "c", res1), held[0])
	assert.Len(t, restarted.CallsOf(plugintest.MethodAllocate), 1, "b, through the restarted instance")
	_, registered := readCheckpointFile(t, h.dir)
	assert.Equal(t, []string{"gpu0", "gpu1", "gpu2"}, registered[res1])
	by.admit()

	p.Stop()
	restarted.Stop()
	h.waitCapacity(res1, 3, 0)
	leaks.verify()
}

// Quirk: socket names other than "<name>.sock". The kubernetes sample device
// plugin listens on "dp." plus the Unix time, without ".sock"; others put
// '=', spaces, '%' or other characters a URL would have to escape in the
// name. Registration succeeds and every call reaches the plugin.
func TestQuirkEndpointNames(t *testing.T) {
	for _, name := range []string{
		"dp.1764412345",              // the kubernetes sample device plugin
		"vendor=gpu.sock",            // '=' as in a CDI name
		"a b%20c.sock",               // a space and something that looks percent-encoded
		"100%.sock",                  // an invalid percent escape
		"gpu?x=1#y.sock",             // a URL's query and fragment characters
		"unix:gpu.sock",              // a URL scheme
		"-gpu.sock",                  // a leading dash
		".hidden.sock",               // a hidden file
		"gp\u00fc-\u65e5\u672c.sock", // non-ASCII
		"kubelet.sock.gpu",           // the registration socket's name as a prefix
	} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t).start()
			by := h.bystander()
			leaks := newLeakCheck(t)

			p := h.registered(res1, devices("d", 2), endpointName(name), withOptions(true, true))
			require.Equal(t, filepath.Join(h.dir, name), p.SocketPath())
			pod := newPod("p", ctr("c", res1, 1))
			h.pods.add(pod)
			require.NoError(t, h.admit(pod))
			assert.Equal(t, []string{"d0"}, h.held(pod, "c", res1))
			opts := h.runOptions(pod, 0)
			require.NotNil(t, opts)
			assert.Len(t, opts.Devices, 1)
			for _, m := range []plugintest.Method{plugintest.MethodGetPreferredAllocation,
				plugintest.MethodAllocate, plugintest.MethodPreStartContainer} {
				assert.Len(t, p.CallsOf(m), 1, m)
			}
			by.admit()

			p.Stop()
			h.waitCapacity(res1, 2, 0)
			leaks.verify()
		})
	}
}

// unusualIDs are device IDs a plugin can report: any string protobuf carries
// is an ID. (Invalid UTF-8 is not among them: Go's protobuf refuses to send
// it in a string field, and refuses to receive it from a plugin written in
// another language, which ends that plugin's stream.) Each must come back
// exactly: from allocation, in the plugin's requests, and through the
// checkpoint.
func unusualIDs() []string {
	return []string{
		"",                           // empty: a plugin bug, still an ID
		"\x00",                       // NUL alone
		"nul\x00in\x00the\x00middle", // NUL inside
		"\x01\x02\x03\x1b[31m\x7f",   // control characters and an ANSI escape
		"tab\tnewline\ncr\r",
		`"quoted" \backslash\ /slash`,
		"<script>&amp;</script>", // what encoding/json escapes as \u003c...
		"\u2028\u2029",           // line and paragraph separators
		"e\u0301",                // "é", decomposed ...
		"\u00e9",                 // ... and precomposed: two IDs
		"GPU", "gpu",             // case matters
		" padded ",                      // leading and trailing spaces
		"\ufeffbom\u200bzwsp",           // invisible characters
		"\u202eevil",                    // right-to-left override
		"\u65e5\u672c\u8a9e-\U0001F642", // multi-byte, and a 4-byte rune
		"\U0010FFFF\uFFFD",              // the last code point, the replacement character
		strings.Repeat("x", 4096),       // 4 KiB
		strings.Repeat("\u00e9", 2048),  // 4 KiB of two-byte runes
		strings.Repeat("\x00", 64),      // only NULs
	}
}

// Quirk: device IDs with NUL and other control characters, 4 KiB IDs,
// unicode, and the same IDs under two resources. Allocation hands out
// exactly those IDs, the plugin is asked for exactly those, and the
// checkpoint (which verifies with package checkpoint) restores exactly those
// after a restart: the plugins coming back find every one of them taken.
func TestQuirkUnusualDeviceIDs(t *testing.T) {
	whole := newLeakCheck(t)
	h := newHarness(t).start()
	ids := unusualIDs()
	want := slices.Sorted(slices.Values(ids))
	require.Len(t, slices.Compact(slices.Clone(want)), len(ids), "the IDs are distinct")
	devs := make([]*pluginapi.Device, len(ids))
	for i, id := range ids {
		devs[i] = dev(id, healthy)
	}
	by := h.bystander()
	p1 := h.registered(res1, devs, endpointName("r1.sock"))
	p2 := h.registered(res2, devs, endpointName("r2.sock"))

	assert.Equal(t, want, slices.Sorted(maps.Keys(h.m.GetAllocatableDevices()[res1])))
	pod := newPod("weird", ctr("c", res1, len(ids), res2, len(ids)))
	h.pods.add(pod)
	require.NoError(t, h.admit(pod))
	assert.Equal(t, want, h.held(pod, "c", res1))
	assert.Equal(t, want, h.held(pod, "c", res2), "the same IDs under another resource are other devices")
	assert.Equal(t, [][]string{want}, allocateRequests(t, p1))
	assert.Equal(t, [][]string{want}, allocateRequests(t, p2))
	devicesBefore := h.m.GetDevices("weird", "c")
	optsBefore := h.runOptions(pod, 0)
	by.admit()

	blob, err := os.ReadFile(filepath.Join(h.dir, checkpoint.DeviceManagerKey))
	require.NoError(t, err)
	require.True(t, json.Valid(blob))
	entries, registered := readCheckpointFile(t, h.dir) // verifies the checksum
	var weird []checkpoint.PodDevicesEntry
	for _, e := range entries {
		if e.PodUID == "weird" {
			weird = append(weird, e)
		}
	}
	require.Len(t, weird, 2)
	for i, res := range []string{res1, res2} {
		assert.Equal(t, res, weird[i].ResourceName)
		assert.Equal(t, checkpoint.DevicesPerNUMA{-1: want}, weird[i].DeviceIDs, res)
		assert.Equal(t, want, registered[res], res)
	}
	cp := checkpoint.New(nil, nil)
	require.NoError(t, cp.UnmarshalCheckpoint(blob))
	require.NoError(t, cp.VerifyChecksum())

	h.restart(nil, nil)
	assert.Equal(t, devicesBefore, h.m.GetDevices("weird", "c"))
	assert.Equal(t, optsBefore, h.runOptions(pod, 0))

	// The plugins come back (new instances) with the same IDs: all taken.
	p1.Stop()
	p2.Stop()
	back1 := h.registered(res1, devs, endpointName("r1.sock"))
	back2 := h.registered(res2, devs, endpointName("r2.sock"))
	for _, res := range []string{res1, res2} {
		late := newPod("late-"+res, ctr("c", res, 1))
		h.pods.add(late)
		err := h.admit(late)
		require.ErrorIs(t, err, ErrInsufficientDevices, res)
		assert.EqualError(t, err, "requested number of devices unavailable for "+res+". Requested: 1, Available: 0")
	}

	stopAll(t, h, back1, back2, by.p)
	whole.verify()
}

// stopAll stops plugins, then the manager.
func stopAll(t *testing.T, h *harness, plugins ...*plugintest.Plugin) {
	t.Helper()
	for _, p := range plugins {
		p.Stop()
	}
	require.NoError(t, h.m.Stop())
}

// registrationStorm is how many times a plugin registers in a row in
// TestQuirkReRegistrationStorm. 1,000 takes about 1 s without the race
// detector and 5 s with it on 2 cores, so it is not scaled down under -race.
const registrationStorm = 1000

// stormers is how many goroutines share the concurrent storm.
const stormers = 8

// checkStorm checks the outcome of a registration storm: every call
// succeeded or failed with a clear error (one that names the plugin's
// socket), and returns the number that succeeded.
func checkStorm(t *testing.T, p *plugintest.Plugin, errs []error) int {
	t.Helper()
	ok := 0
	for i, err := range errs {
		if err == nil {
			ok++
			continue
		}
		assert.Contains(t, err.Error(), p.SocketPath(), "registration %d failed without naming the socket", i)
	}
	t.Logf("%d of %d registrations succeeded", ok, len(errs))
	return ok
}

// Quirk: a plugin that re-registers in a hot loop (one that re-registers on
// every file event in the socket directory can), 1,000 times in a row and
// then 1,000 times from 8 goroutines at once, all on the same socket. Each
// registration replaces the previous connection (the kubelet refuses it);
// afterwards exactly one connection serves the resource, nothing leaks, and
// plugins registered before and after the storm are served.
func TestQuirkReRegistrationStorm(t *testing.T) {
	h := newHarness(t, quietLogs(t)).start()
	before := h.bystander()
	leaks := newLeakCheck(t)
	p := h.plugin(res1, devices("gpu", 4))

	errs := make([]error, 2*registrationStorm)
	for i := range registrationStorm {
		errs[i] = p.Register(h.kubeletSocket())
	}
	require.NoError(t, errs[registrationStorm-1], "the last registration in a row")
	var wg sync.WaitGroup
	for g := range stormers {
		wg.Go(func() {
			for i := registrationStorm + g; i < len(errs); i += stormers {
				errs[i] = p.Register(h.kubeletSocket())
			}
		})
	}
	wg.Wait()
	ok := checkStorm(t, p, errs)
	require.Positive(t, ok)

	// One connection is left: the manager holds one instance, the last
	// registration's. A list sent now reaches the manager through that
	// instance's stream alone (the replaced ones' lists are dropped), so its
	// arrival shows that stream open; once the replaced instances' streams
	// have closed, it is the one stream the plugin serves.
	require.Equal(t, 1, h.connections(res1), "one instance in the manager")
	h.waitCapacity(res1, 4, 4)
	options := len(p.CallsOf(plugintest.MethodGetDevicePluginOptions))
	assert.GreaterOrEqual(t, options, ok, "every successful registration dialled back")
	assert.LessOrEqual(t, options, len(errs))
	assert.LessOrEqual(t, len(p.CallsOf(plugintest.MethodListAndWatch)), options)
	p.Update([]*pluginapi.Device{dev("gpu0", healthy), dev("gpu1", healthy), dev("gpu2", healthy), dev("gpu3", sick)})
	h.waitCapacity(res1, 4, 3)
	h.eventually(func() bool { return p.Streams() == 1 }, "one stream open on the plugin: the last instance's")

	after := h.registered(res2, devices("late", 2), endpointName("late.sock"))
	pod := newPod("p", ctr("c", res1, 3, res2, 1))
	h.pods.add(pod)
	require.NoError(t, h.admit(pod))
	assert.Equal(t, []string{"gpu0", "gpu1", "gpu2"}, h.held(pod, "c", res1))
	assert.Len(t, p.CallsOf(plugintest.MethodAllocate), 1)
	assert.Len(t, after.CallsOf(plugintest.MethodAllocate), 1)
	before.admit()

	p.Stop()
	after.Stop()
	h.waitCapacity(res1, 4, 0)
	h.waitCapacity(res2, 2, 0)
	leaks.verify()
}

// quietLogs keeps the manager's errors in the test log but not its V(2)
// registration lines, thousands of them in a registration storm.
func quietLogs(t *testing.T) func(*Options) {
	return func(o *Options) {
		o.Logger = ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(1)))
	}
}

// Quirk: the plugin's socket disappears between its Register call and the
// manager's dial-back. Registration fails with an error naming the socket,
// long before the dial-back's deadline (DialTimeout is a minute here, the
// registration's own deadline waitTimeout: a registration that waited for the
// dial-back's deadline would end with DeadlineExceeded instead). Nothing is
// registered, nothing leaks, and the plugin registers fine once it serves
// again.
func TestQuirkSocketGoneBeforeDialBack(t *testing.T) {
	for _, tc := range []struct {
		name string
		// vanish makes p's socket disappear and returns what Register says.
		vanish func(t *testing.T, h *harness, p *plugintest.Plugin) error
		want   string
	}{
		{
			name: "socket file removed, plugin still serving",
			vanish: func(t *testing.T, h *harness, p *plugintest.Plugin) error {
				require.NoError(t, os.Remove(p.SocketPath()))
				return h.registerErr(p)
			},
			want: "does not exist",
		},
		{
			name: "plugin stopped",
			vanish: func(_ *testing.T, h *harness, p *plugintest.Plugin) error {
				p.Stop()
				return h.registerErr(p)
			},
			want: "does not exist",
		},
		{
			name: "plugin stops during the dial-back",
			vanish: func(t *testing.T, h *harness, p *plugintest.Plugin) error {
				p.Block(plugintest.MethodGetDevicePluginOptions) // released by Stop
				done := make(chan error, 1)
				go func() { done <- h.registerErr(p) }()
				waitCalls(t, p, plugintest.MethodGetDevicePluginOptions, 1)
				p.Stop()
				return <-done
			},
			want: "failed to",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(o *Options) { o.DialTimeout = time.Minute }).start()
			by := h.bystander()
			leaks := newLeakCheck(t)

			p := h.plugin(res1, devices("d", 2))
			err := tc.vanish(t, h, p)
			require.Error(t, err)
			assert.Equal(t, codes.Unknown, status.Code(err), "%v", err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Contains(t, err.Error(), p.SocketPath(), "the error names the socket")
			c, _ := h.capacity(res1)
			assert.Equal(t, int64(-1), c, "nothing registered")
			assert.Zero(t, h.connections(res1))
			by.admit()

			// The plugin restarts properly and registers.
			p.Stop()
			back := h.registered(res1, devices("d", 2))
			pod := newPod("p", ctr("c", res1, 2))
			h.pods.add(pod)
			require.NoError(t, h.admit(pod))
			back.Stop()
			h.waitCapacity(res1, 2, 0)
			leaks.verify()
		})
	}
}

// Quirk: a plugin crashed and left its socket file behind; it registers
// (say, from a supervisor script) before anything listens again. Nothing
// accepts on the socket, so the dial-back can only fail when its deadline
// passes, as the kubelet's does (gRPC keeps retrying a refused
// connection); DialTimeout bounds it. The error names the socket. The
// timeout is long enough for the bystander's dial-back, which must succeed.
func TestQuirkStaleSocketFile(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.DialTimeout = 2 * time.Second }).start()
	by := h.bystander()
	leaks := newLeakCheck(t)

	p, err := plugintest.New(plugintest.Options{ResourceName: res1, SocketDir: h.dir})
	require.NoError(t, err)
	lis, err := net.Listen("unix", p.SocketPath())
	require.NoError(t, err)
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	require.NoError(t, lis.Close())
	t.Cleanup(func() { os.Remove(p.SocketPath()) })

	err = h.registerErr(p)
	require.Error(t, err)
	assert.Equal(t, codes.Unknown, status.Code(err), "%v", err)
	assert.Contains(t, err.Error(), "failed to dial device plugin")
	assert.Contains(t, err.Error(), p.SocketPath(), "the error names the socket")
	assert.Zero(t, h.connections(res1))
	by.admit()
	leaks.verify()
}

// Quirk: after the kubelet restarts (kubelet.sock is re-created and every
// plugin socket removed), a plugin re-registers a few seconds later, first
// as it was (its socket is gone: refused, naming it), then as a new
// instance. The resource restored from the checkpoint with capacity 0 gets
// its devices back, and the allocations made before the restart are kept,
// also when the plugin comes back after the grace period has removed the
// resource.
func TestQuirkReRegisterAfterManagerRestart(t *testing.T) {
	for _, tc := range []struct {
		name    string
		after   time.Duration
		removed []string
	}{
		{"seconds later", 3 * time.Second, nil},
		{"after the grace period", DefaultStopGracePeriod + time.Second, []string{res1, resBystander}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			whole := newLeakCheck(t)
			h := newHarness(t).start()
			p := h.registered(res1, devices("gpu", 4))
			by := h.bystander()
			a := newPod("a", ctr("c", res1, 2))
			h.pods.add(a)
			require.NoError(t, h.admit(a))
			held := h.held(a, "c", res1)
			optsBefore := h.runOptions(a, 0)
			by.admit()

			h.restart(nil, nil)
			require.FileExists(t, h.kubeletSocket(), "kubelet.sock re-created")
			require.NoFileExists(t, p.SocketPath(), "plugin sockets removed at start")
			c, al := h.capacity(res1)
			require.Equal(t, []int64{0, 0}, []int64{c, al}, "restored from the checkpoint")
			leaks := newLeakCheck(t)

			err := h.registerErr(p)
			require.Error(t, err, "the old instance's socket was removed at start")
			assert.Contains(t, err.Error(), p.SocketPath())
			assert.Contains(t, err.Error(), "does not exist")

			// Time passes on the manager's clock, which times the grace
			// period, before the plugin comes back as a new instance.
			h.clock.Step(tc.after)
			_, _, removed := h.m.GetCapacity()
			assert.Equal(t, tc.removed, removed)
			restarted := h.registered(res1, devices("gpu", 4))
			assert.Equal(t, held, h.held(a, "c", res1), "allocation kept")
			assert.Equal(t, optsBefore, h.runOptions(a, 0))
			b := newPod("b", ctr("c", res1, 3))
			h.pods.add(b)
			err = h.admit(b)
			require.ErrorIs(t, err, ErrInsufficientDevices)
			assert.EqualError(t, err, "requested number of devices unavailable for "+res1+". Requested: 3, Available: 2")
			b = newPod("b2", ctr("c", res1, 2))
			h.pods.add(b)
			require.NoError(t, h.admit(b))
			for _, id := range h.held(b, "c", res1) {
				assert.NotContains(t, held, id, "b2 got the devices a does not hold")
			}
			assert.Equal(t, [][]string{h.held(b, "c", res1)}, allocateRequests(t, restarted), "a is not allocated again")
			entries, registered := readCheckpointFile(t, h.dir)
			assert.Equal(t, []string{"gpu0", "gpu1", "gpu2", "gpu3"}, registered[res1])
			assert.Len(t, entries, 3, "a, b2 and the bystander's pod")
			back := h.bystander()
			back.admit()

			restarted.Stop()
			back.p.Stop()
			h.waitCapacity(res1, 4, 0)
			leaks.verify()
			stopAll(t, h, p, by.p)
			whole.verify()
		})
	}
}

// A plugin replaced by a newer registration on its socket has ended as
// expected, whether or not its ListAndWatch stream had opened: that is no
// error. In a registration storm, many instances are replaced before their
// stream opens.
func TestQuirkReRegistrationStormLogsNoFalseErrors(t *testing.T) {
	logger, buf := bufferedLogger(t)
	h := newHarness(t, func(o *Options) { o.Logger = logger }).start()
	p := h.plugin(res1, devices("gpu", 1))
	var wg sync.WaitGroup
	for range stormers {
		wg.Go(func() {
			for range 25 {
				assert.NoError(t, p.Register(h.kubeletSocket()))
			}
		})
	}
	wg.Wait()
	h.eventually(func() bool { return h.connections(res1) == 1 && p.Streams() == 1 }, "one connection left")
	require.NoError(t, h.m.Stop())
	var falseAlarms int
	for _, e := range buf.Data() {
		if e.Type == ktesting.LogError && errors.Is(e.Err, endpoint.ErrStopped) {
			falseAlarms++
		}
	}
	assert.Zero(t, falseAlarms, "error logs for instances replaced by a newer registration")
}

// bufferedLogger returns a logger for the manager whose entries the test can
// read back.
func bufferedLogger(t *testing.T) (logger klog.Logger, buf ktesting.Buffer) {
	logger = ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(1), ktesting.BufferLogs(true)))
	underlier, ok := logger.GetSink().(ktesting.Underlier)
	require.True(t, ok)
	return logger, underlier.GetBuffer()
}

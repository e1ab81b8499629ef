//go:build reliability

package reliability

import (
	"context"
	"errors"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/checkpoint"
	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/plugintest"
)

// Plugin faults: the plugin process dies in the middle of an RPC, hangs in
// one, or answers something malformed. Every case ends with a clear error
// (its text asserted, and errors.Is on devicemanager's sentinels) or a
// tolerant reading documented in the case; a failed admission leaves the
// ledger as it was (GetDevices nil, and every device it had picked can be
// allocated again); a well-behaved plugin registered alongside keeps being
// served; and no goroutine or file descriptor outlives the case. A fault is
// counted where the test sees it happen: the plugin process's exit by
// SIGKILL (its process state), a call's DeadlineExceeded or Canceled (the
// error returned, or the manager's rpc error metric), a malformed answer's
// refusal (the error returned, logged or counted) or its documented reading;
// each case must see exactly the faults it injects.

// Kinds of fault, as the figures count them.
const (
	kindDeath   = "process death"
	kindHang    = "hang"
	kindRefused = "malformed answer refused" // the manager's error: returned, logged, or counted
	kindRead    = "malformed answer read as documented"
)

// shortTimeout is the deadline of the call a hang case blocks (CallTimeout
// or PreStartTimeout): it must fire, soon. The case's other deadlines keep
// their defaults, so that what must succeed meanwhile is not held to it.
// DialTimeout keeps its default even where the options call hangs: it also
// bounds connecting, and every registration of the case is held to it.
const shortTimeout = 250 * time.Millisecond

// faultCase is one injected fault: run injects it into a started rig with a
// registered bystander, checks the outcome, and counts in seen each fault
// it saw happen. It must see faults of its kind (1 when zero), no other.
type faultCase struct {
	name   string
	kind   string
	faults int
	opts   func(*devicemanager.Options)
	run    func(t *testing.T, r *rig, seen observed)
}

// observed counts faults seen, by kind.
type observed map[string]int

// saw counts one fault of kind when ok: the result of the assertion that
// saw it happen, right before.
func (o observed) saw(kind string, ok bool) {
	if ok {
		o[kind]++
	}
}

func TestPluginFaults(t *testing.T) {
	cases := slices.Concat(deathCases(), hangCases(), answerCases())
	fig := Figures{Category: "plugin faults"}
	defer recordOnExit(t, &fig, time.Now())
	fig.param("deadline of the hung Allocate, GetPreferredAllocation and PreStartContainer calls", shortTimeout.String())
	injected, seen := observed{}, observed{}
	var leakedFDs, leakedGoroutines, failed int
	for _, tc := range cases {
		want := max(tc.faults, 1)
		injected[tc.kind] += want
		ok := t.Run(tc.name, func(t *testing.T) {
			leaks := newLeakCheck(t)
			r := newRig(t, tc.opts).start()
			r.bystander()
			o := observed{}
			tc.run(t, r, o)
			assert.Equal(t, observed{tc.kind: want}, o, "faults seen")
			for kind, n := range o {
				seen[kind] += n
			}
			r.by.admit(t) // the manager still serves a well-behaved plugin
			lost, doubled := r.audit()
			fig.Lost += lost
			fig.Doubled += doubled
			r.shutdown()
			fds, goroutines := leaks.verify(t)
			leakedFDs += fds
			leakedGoroutines += goroutines
		})
		fig.Cases++
		if !ok {
			failed++
		}
	}
	for _, kind := range []string{kindDeath, kindHang, kindRefused, kindRead} {
		fig.Faults += seen[kind]
	}
	fig.Kills = seen[kindDeath]
	fig.exact(t, "process deaths seen (the plugin process's exit by SIGKILL)", seen[kindDeath], injected[kindDeath])
	fig.exact(t, "hangs seen (a call past its deadline, cancelled, or held while the rest is served)", seen[kindHang], injected[kindHang])
	fig.exact(t, "malformed answers refused (the manager's error: returned, logged or counted)", seen[kindRefused], injected[kindRefused])
	fig.exact(t, "malformed answers read as documented (the reading asserted)", seen[kindRead], injected[kindRead])
	fig.exact(t, "failed cases", failed, 0)
	fig.exact(t, "leaked fds", leakedFDs, 0)
	fig.exact(t, "leaked goroutines", leakedGoroutines, 0)
}

// BUG: the logs of an admission bypass Options.Logger when the caller's
// context carries no logger. allocate.go:117-120 takes klog.FromContext(ctx)
// and falls back to the manager's logger only when its sink is nil, but
// klog.FromContext never returns a nil sink: without a logger in ctx it
// returns klog.Background(), the process-wide logger. So "Device plugin
// GetPreferredAllocation failed" (and the V(3) allocation decisions) go to
// the global klog instead of the logger the embedder configured. Fix:
// logr.FromContext(ctx), and m.log when it returns an error.
func TestAdmissionLogsGoToOptionsLogger(t *testing.T) {
	r := newRig(t).start()
	p := r.register(r.plugin(resGPU, "gpu.sock", healthyDevices("d", 2), withPreferred))
	p.SetError(plugintest.MethodGetPreferredAllocation, status.Error(codes.Unavailable, "thinking"))
	pod := podOf("p", resGPU, 1)
	require.NoError(t, r.admit(pod))
	found := false
	for _, l := range r.errorLogs() {
		found = found || containsAll(l, "GetPreferredAllocation failed", "thinking")
	}
	assert.True(t, found, "the failed GetPreferredAllocation is logged to Options.Logger; error logs: %q", r.errorLogs())
	r.shutdown()
}

// BUG (latent, found by FuzzDeviceUpdate): a string that is not valid UTF-8
// in the ledger makes the manager write a checkpoint that does not verify.
// The checkpoint's JSON replaces invalid UTF-8 with U+FFFD (as
// encoding/json does, checkpoint/encode.go), while the checksum hashes the
// strings as they were (checkpoint/checksum.go); nothing checks the blob
// before it is written (devicemanager/persist.go). On the next Start the
// file is "corrupted", moved aside, and every allocation is lost: devices
// in use are handed out again. Device IDs cannot carry invalid UTF-8 over
// gRPC (protobuf refuses it), but Allocate takes a pod UID or container
// name from the embedder without checking it. Kubernetes UIDs are always
// valid; an alternative kubelet's need not be. Fix: refuse such a pod in
// Allocate with a clear error, or verify the encoded blob before writing.
func TestCheckpointOfInvalidUTF8PodVerifies(t *testing.T) {
	r := newRig(t).start()
	r.register(r.plugin(resGPU, "gpu.sock", healthyDevices("d", 2)))
	good := podOf("good", resGPU, 1)
	require.NoError(t, r.admit(good))
	// JSON cannot carry a UID that is not UTF-8: the admission is refused
	// rather than written into a checkpoint that would not verify.
	odd := podOf("odd-\xff", resGPU, 1)
	require.ErrorIs(t, r.admit(odd), devicemanager.ErrInvalidRequest)
	r.release(odd)
	store, err := checkpoint.NewManager(r.dir)
	require.NoError(t, err)
	assert.NoError(t, store.GetCheckpoint(checkpoint.DeviceManagerKey, checkpoint.New(nil, nil)),
		"the checkpoint the manager wrote verifies")
	r.restart()
	assert.Equal(t, []string{"d0"}, r.held(good, resGPU), "good's allocation survives a restart")
	r.shutdown()
}

// gpuChild is the plugin child of resGPU with 4 devices on gpu.sock.
func gpuChild(hang plugintest.Method) childConfig {
	return childConfig{resource: resGPU, endpoint: "gpu.sock", devices: 4, hang: hang}
}

// assertRefused checks that err wraps sentinel and reads prefix..., and that
// the refused pod holds nothing; the pod leaves the active list. It reports
// whether every check held.
func assertRefused(t *testing.T, r *rig, pod *v1.Pod, err error, sentinel error, prefix string) bool {
	t.Helper()
	require.Error(t, err)
	ok := assert.ErrorIs(t, err, sentinel)
	ok = assert.True(t, strings.HasPrefix(err.Error(), prefix), "error %q does not start with %q", err, prefix) && ok
	ok = assert.Nil(t, r.m.GetDevices(string(pod.UID), "c"), "a refused admission holds no device") && ok
	r.release(pod)
	return ok
}

// requireAllFree admits a pod asking every device of each (resource, count)
// pair: it succeeds only if no failed admission still holds one.
func requireAllFree(t *testing.T, r *rig, uid string, limits ...any) *v1.Pod {
	t.Helper()
	pod := podOf(uid, limits...)
	require.NoError(t, r.admit(pod), "every device is free again")
	return pod
}

func longTimeouts(o *devicemanager.Options) {
	o.CallTimeout, o.PreStartTimeout = time.Minute, time.Minute
	o.RequirePlugin = []string{resGPU}
}

func shortCalls(o *devicemanager.Options) {
	o.CallTimeout = shortTimeout
	o.RequirePlugin = []string{resGPU}
}

func shortPreStart(o *devicemanager.Options) {
	o.PreStartTimeout = shortTimeout
	o.RequirePlugin = []string{resGPU}
}

func requireGPU(o *devicemanager.Options) { o.RequirePlugin = []string{resGPU} }

// withMetrics adds a Prometheus registry to tune's options, for a case that
// sees a fault in the manager's metrics (rpcErrors). Such a case must not
// restart the manager: a second one cannot register in the same registry.
func withMetrics(tune func(*devicemanager.Options)) func(*devicemanager.Options) {
	return func(o *devicemanager.Options) {
		tune(o)
		o.Registerer = prometheus.NewRegistry()
	}
}

// rpcErrors returns the manager's count of failed calls of method to the
// plugin of res (MetricRPCErrorsTotal); the rig's options need withMetrics.
func rpcErrors(t *testing.T, r *rig, res string, method plugintest.Method) int {
	t.Helper()
	g, ok := r.opts.Registerer.(prometheus.Gatherer)
	require.True(t, ok, "the case's options need withMetrics")
	return metricCount(t, g, devicemanager.MetricRPCErrorsTotal, map[string]string{"resource_name": res, "method": string(method)})
}

// deathCases kill a real plugin process (the test binary re-executed as a
// plugintest plugin) at a chosen point of each RPC kind. Timeouts are long:
// only the death ends the call.
func deathCases() []faultCase {
	return []faultCase{{
		name: "process dies in ListAndWatch before its first message", kind: kindDeath, opts: longTimeouts,
		run: func(t *testing.T, r *rig, seen observed) {
			c := r.startChild(gpuChild(plugintest.MethodListAndWatch))
			c.expect(lineReady)
			c.expect(lineHangPrefix + string(plugintest.MethodListAndWatch))
			c.kill()
			seen.saw(kindDeath, assert.True(t, c.killedBy(syscall.SIGKILL), "the plugin process ended by SIGKILL"))
			r.waitErrorLog("ListAndWatch ended unexpectedly", resGPU)
			c1, a1 := r.capacity(resGPU)
			assert.Equal(t, []int64{-1, -1}, []int64{c1, a1}, "no device list ever came: the resource is not registered")
			pod := podOf("p", resGPU, 1)
			assertRefused(t, r, pod, r.admit(pod), devicemanager.ErrUnregisteredResource, "cannot allocate unregistered device "+resGPU)

			back := r.startChild(gpuChild(""))
			back.expect(lineReady)
			r.waitCapacity(resGPU, 4, 4)
			requireAllFree(t, r, "all", resGPU, 4)
		},
	}, {
		name: "process dies while its ListAndWatch stream is open", kind: kindDeath, opts: longTimeouts,
		run: func(t *testing.T, r *rig, seen observed) {
			c := r.startChild(gpuChild(""))
			c.expect(lineReady)
			r.waitCapacity(resGPU, 4, 4)
			a := podOf("a", resGPU, 2)
			require.NoError(t, r.admit(a))
			held := r.held(a, resGPU)
			c.kill()
			seen.saw(kindDeath, assert.True(t, c.killedBy(syscall.SIGKILL), "the plugin process ended by SIGKILL"))
			// The devices stay in capacity, none allocatable, for the grace
			// period; the allocation stays.
			r.waitCapacity(resGPU, 4, 0)
			r.waitErrorLog("ListAndWatch ended unexpectedly", resGPU)
			b := podOf("b", resGPU, 1)
			assertRefused(t, r, b, r.admit(b), devicemanager.ErrPluginNotReady,
				"no healthy devices present; cannot allocate unhealthy devices "+resGPU+": device plugin not ready")
			assert.Equal(t, held, r.held(a, resGPU))

			back := r.startChild(gpuChild(""))
			back.expect(lineReady)
			r.waitCapacity(resGPU, 4, 4)
			rest := podOf("rest", resGPU, 2)
			require.NoError(t, r.admit(rest))
			for _, id := range r.held(rest, resGPU) {
				assert.NotContains(t, held, id)
			}
			late := podOf("late", resGPU, 1)
			assertRefused(t, r, late, r.admit(late), devicemanager.ErrInsufficientDevices,
				"requested number of devices unavailable for "+resGPU+". Requested: 1, Available: 0")
		},
	}, {
		name: "process dies in Allocate", kind: kindDeath, opts: longTimeouts,
		run: func(t *testing.T, r *rig, seen observed) {
			c := r.startChild(gpuChild(plugintest.MethodAllocate))
			c.expect(lineReady)
			r.waitCapacity(resGPU, 4, 4)
			pod := podOf("p", resGPU, 2)
			done := make(chan error, 1)
			go func() { done <- r.admit(pod) }()
			c.expect(lineHangPrefix + string(plugintest.MethodAllocate))
			c.kill()
			seen.saw(kindDeath, assert.True(t, c.killedBy(syscall.SIGKILL), "the plugin process ended by SIGKILL"))
			err := waitResult(t, done, "Allocate")
			assertRefused(t, r, pod, err, devicemanager.ErrPluginCall, "device plugin Allocate rpc for "+resGPU+" failed: ")
			r.waitCapacity(resGPU, 4, 0)

			back := r.startChild(gpuChild(""))
			back.expect(lineReady)
			r.waitCapacity(resGPU, 4, 4)
			requireAllFree(t, r, "all", resGPU, 4)
		},
	}, {
		name: "process dies in PreStartContainer", kind: kindDeath, opts: longTimeouts,
		run: func(t *testing.T, r *rig, seen observed) {
			cfg := gpuChild(plugintest.MethodPreStartContainer)
			cfg.preStart = true
			c := r.startChild(cfg)
			c.expect(lineReady)
			r.waitCapacity(resGPU, 4, 4)
			a := podOf("a", resGPU, 2)
			require.NoError(t, r.admit(a))
			held := r.held(a, resGPU)
			done := make(chan error, 1)
			go func() {
				_, err := r.m.GetDeviceRunContainerOptions(context.Background(), a, &a.Spec.Containers[0])
				done <- err
			}()
			c.expect(lineHangPrefix + string(plugintest.MethodPreStartContainer))
			c.kill()
			seen.saw(kindDeath, assert.True(t, c.killedBy(syscall.SIGKILL), "the plugin process ended by SIGKILL"))
			err := waitResult(t, done, "GetDeviceRunContainerOptions")
			require.ErrorIs(t, err, devicemanager.ErrPluginCall)
			assert.True(t, strings.HasPrefix(err.Error(), "device plugin PreStartContainer rpc failed with err: "), "%v", err)
			// The admission stands (the kubelet fails the container's start
			// and retries it); nothing else changes.
			assert.Equal(t, held, r.held(a, resGPU))

			cfg.hang = ""
			back := r.startChild(cfg)
			back.expect(lineReady)
			r.waitCapacity(resGPU, 4, 4)
			opts, err := r.m.GetDeviceRunContainerOptions(context.Background(), a, &a.Spec.Containers[0])
			require.NoError(t, err, "the container starts once its plugin is back")
			require.NotNil(t, opts)
			assert.Len(t, opts.Devices, 2)
		},
	}, {
		name: "process dies in GetPreferredAllocation", kind: kindDeath, opts: longTimeouts,
		run: func(t *testing.T, r *rig, seen observed) {
			cfg := gpuChild(plugintest.MethodGetPreferredAllocation)
			cfg.preferred = true
			c := r.startChild(cfg)
			c.expect(lineReady)
			r.waitCapacity(resGPU, 4, 4)
			pod := podOf("p", resGPU, 1)
			done := make(chan error, 1)
			go func() { done <- r.admit(pod) }()
			c.expect(lineHangPrefix + string(plugintest.MethodGetPreferredAllocation))
			c.kill()
			seen.saw(kindDeath, assert.True(t, c.killedBy(syscall.SIGKILL), "the plugin process ended by SIGKILL"))
			err := waitResult(t, done, "Allocate")
			// A failed preference means "no preference"; what ends the
			// admission is the dead plugin: its Allocate fails, or its
			// endpoint is already stopped, or the resource is already not
			// ready, depending on when the manager noticed the death.
			switch {
			case errors.Is(err, devicemanager.ErrEndpointStopped):
				assertRefused(t, r, pod, err, devicemanager.ErrEndpointStopped, "endpoint "+resGPU+" (")
				assert.Contains(t, err.Error(), "has been stopped")
			case errors.Is(err, devicemanager.ErrPluginNotReady):
				assertRefused(t, r, pod, err, devicemanager.ErrPluginNotReady, "no healthy devices present")
			default:
				assertRefused(t, r, pod, err, devicemanager.ErrPluginCall, "device plugin Allocate rpc for "+resGPU+" failed: ")
			}

			back := r.startChild(gpuChild(""))
			back.expect(lineReady)
			r.waitCapacity(resGPU, 4, 4)
			requireAllFree(t, r, "all", resGPU, 4)
		},
	}}
}

// hangCases block an in-process plugin in each RPC (plugintest Block): the
// manager's deadlines fire, and everything else keeps working meanwhile.
func hangCases() []faultCase {
	return []faultCase{{
		// The registration waits the default DialTimeout.
		name: "hangs in GetDevicePluginOptions", kind: kindHang, opts: requireGPU,
		run: func(t *testing.T, r *rig, seen observed) {
			p := r.plugin(resGPU, "gpu.sock", healthyDevices("d", 4))
			release := p.Block(plugintest.MethodGetDevicePluginOptions)
			defer release()
			err := r.registerWith(p, p.RegisterRequest())
			require.Error(t, err)
			assert.Equal(t, codes.Unknown, status.Code(err))
			assert.Contains(t, err.Error(), "failed to get device plugin options: "+p.SocketPath())
			seen.saw(kindHang, assert.Contains(t, err.Error(), "DeadlineExceeded"))
			c, _ := r.capacity(resGPU)
			assert.Equal(t, int64(-1), c, "not registered")
			r.by.admit(t)

			release()
			r.register(p)
			requireAllFree(t, r, "all", resGPU, 4)
		},
	}, {
		// A stream has no deadline: it lives as long as the plugin. Until
		// its first message the resource is not ready, and the rest is
		// usable.
		name: "hangs in ListAndWatch", kind: kindHang, opts: requireGPU,
		run: func(t *testing.T, r *rig, seen observed) {
			p := r.plugin(resGPU, "gpu.sock", healthyDevices("d", 4))
			release := p.Block(plugintest.MethodListAndWatch)
			defer release()
			require.NoError(t, p.Register(r.kubeletSocket()))
			waitCalls(t, p, plugintest.MethodListAndWatch, 1)
			c, _ := r.capacity(resGPU)
			assert.Equal(t, int64(-1), c, "not registered before its first message")
			pod := podOf("p", resGPU, 1)
			assertRefused(t, r, pod, r.admit(pod), devicemanager.ErrPluginNotReady,
				"cannot allocate unregistered device "+resGPU+": device plugin not ready (its plugin has not listed its devices yet)")
			r.by.admit(t)
			// Seen as a stream the manager opened and still waits on while
			// it served the rest.
			c, _ = r.capacity(resGPU)
			seen.saw(kindHang, assert.Equal(t, int64(-1), c, "still no first message"))

			release()
			r.waitCapacity(resGPU, 4, 4)
			requireAllFree(t, r, "all", resGPU, 4)
		},
	}, {
		// A preference that does not come in time is no preference.
		name: "hangs in GetPreferredAllocation", kind: kindHang, opts: withMetrics(shortCalls),
		run: func(t *testing.T, r *rig, seen observed) {
			p := r.register(r.plugin(resGPU, "gpu.sock", healthyDevices("d", 4), withPreferred))
			release := p.Block(plugintest.MethodGetPreferredAllocation)
			defer release()
			pod := podOf("p", resGPU, 1)
			require.NoError(t, r.admit(pod), "admitted without the plugin's preference")
			assert.Len(t, r.held(pod, resGPU), 1)
			calls := p.CallsOf(plugintest.MethodGetPreferredAllocation)
			require.Len(t, calls, 1)
			require.False(t, calls[0].Deadline.IsZero(), "the call has a deadline")
			assert.LessOrEqual(t, calls[0].Deadline.Sub(calls[0].Time), shortTimeout)
			assert.Len(t, p.CallsOf(plugintest.MethodAllocate), 1)
			seen.saw(kindHang, assert.Equal(t, 1, rpcErrors(t, r, resGPU, plugintest.MethodGetPreferredAllocation),
				"the manager counts the call that hit its deadline"))
		},
	}, {
		name: "hangs in Allocate", kind: kindHang, opts: shortCalls,
		run: func(t *testing.T, r *rig, seen observed) {
			p := r.register(r.plugin(resGPU, "gpu.sock", healthyDevices("d", 4)))
			release := p.Block(plugintest.MethodAllocate)
			defer release()
			pod := podOf("p", resGPU, 2)
			err := r.admit(pod)
			assertRefused(t, r, pod, err, devicemanager.ErrPluginCall,
				"device plugin Allocate rpc for "+resGPU+" failed: rpc error: code = DeadlineExceeded")
			seen.saw(kindHang, assert.Equal(t, codes.DeadlineExceeded, status.Code(err)))
			calls := p.CallsOf(plugintest.MethodAllocate)
			require.Len(t, calls, 1)
			assert.LessOrEqual(t, calls[0].Deadline.Sub(calls[0].Time), shortTimeout)
			r.by.admit(t)

			release()
			requireAllFree(t, r, "all", resGPU, 4)
		},
	}, {
		name: "hangs in PreStartContainer", kind: kindHang, opts: shortPreStart,
		run: func(t *testing.T, r *rig, seen observed) {
			p := r.register(r.plugin(resGPU, "gpu.sock", healthyDevices("d", 4), withPreStart))
			a := podOf("a", resGPU, 2)
			require.NoError(t, r.admit(a))
			held := r.held(a, resGPU)
			release := p.Block(plugintest.MethodPreStartContainer)
			defer release()
			_, err := r.m.GetDeviceRunContainerOptions(context.Background(), a, &a.Spec.Containers[0])
			require.ErrorIs(t, err, devicemanager.ErrPluginCall)
			assert.True(t, strings.HasPrefix(err.Error(),
				"device plugin PreStartContainer rpc failed with err: rpc error: code = DeadlineExceeded"), "%v", err)
			seen.saw(kindHang, assert.Equal(t, codes.DeadlineExceeded, status.Code(err)))
			assert.Equal(t, held, r.held(a, resGPU), "the admission stands")
			r.by.admit(t)

			release()
			opts, err := r.m.GetDeviceRunContainerOptions(context.Background(), a, &a.Spec.Containers[0])
			require.NoError(t, err)
			require.NotNil(t, opts)
			assert.Len(t, opts.Devices, 2)
		},
	}, {
		// With long deadlines, calls hang until released or cancelled: the
		// manager serves everything else meanwhile, without waiting for them.
		name: "a hung plugin delays only its own pods", kind: kindHang, faults: 2, opts: longTimeouts,
		run: func(t *testing.T, r *rig, seen observed) {
			p := r.register(r.plugin(resGPU, "gpu.sock", healthyDevices("d", 4), withPreStart))
			release := p.Block(plugintest.MethodAllocate)
			defer release()
			slow := podOf("slow", resGPU, 2)
			done := make(chan error, 1)
			go func() { done <- r.admit(slow) }()
			waitCalls(t, p, plugintest.MethodAllocate, 1)

			r.by.admit(t)
			r.register(r.plugin(resNIC, "nic.sock", healthyDevices("n", 2)))
			require.NoError(t, r.admit(podOf("nic", resNIC, 2)))
			c, a := r.capacity(resGPU)
			assert.Equal(t, []int64{4, 4}, []int64{c, a})
			r.m.UpdateAllocatedDevices()
			select {
			case err := <-done:
				require.FailNow(t, "Allocate returned while its plugin hangs", "%v", err)
			default:
				seen.saw(kindHang, true) // still in flight, everything else served
			}
			release()
			require.NoError(t, waitResult(t, done, "Allocate"))
			assert.Len(t, r.held(slow, resGPU), 2)

			releasePreStart := p.Block(plugintest.MethodPreStartContainer)
			defer releasePreStart()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() {
				_, err := r.m.GetDeviceRunContainerOptions(ctx, slow, &slow.Spec.Containers[0])
				done <- err
			}()
			waitCalls(t, p, plugintest.MethodPreStartContainer, 1)
			r.by.admit(t)
			select {
			case err := <-done:
				require.FailNow(t, "PreStartContainer returned while its plugin hangs", "%v", err)
			default:
			}
			cancel()
			err := waitResult(t, done, "GetDeviceRunContainerOptions")
			require.ErrorIs(t, err, devicemanager.ErrPluginCall)
			seen.saw(kindHang, assert.Equal(t, codes.Canceled, status.Code(err)))
		},
	}}
}

func withPreferred(o *plugintest.Options) { o.GetPreferredAllocationAvailable = true }
func withPreStart(o *plugintest.Options)  { o.PreStartRequired = true }

// answerCases make an in-process plugin answer what no plugin should.
func answerCases() []faultCase {
	return []faultCase{{
		// All or nothing: the gpu, allocated first (resources go in name
		// order), is rolled back when the nic's answer is refused.
		name: "Allocate answers no container response", kind: kindRefused, opts: requireGPU,
		run: func(t *testing.T, r *rig, seen observed) {
			gpu := r.register(r.plugin(resGPU, "gpu.sock", healthyDevices("d", 4)))
			nic := r.register(r.plugin(resNIC, "nic.sock", healthyDevices("n", 2)))
			nic.SetAllocateFunc(func(context.Context, *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
				return &pluginapi.AllocateResponse{}, nil
			})
			pod := podOf("p", resGPU, 2, resNIC, 1)
			seen.saw(kindRefused, assertRefused(t, r, pod, r.admit(pod), devicemanager.ErrPluginCall,
				"device plugin Allocate rpc for "+resNIC+" failed: no containers return in allocation response"))
			assert.Len(t, gpu.CallsOf(plugintest.MethodAllocate), 1)
			nic.SetAllocateFunc(nil)
			requireAllFree(t, r, "all", resGPU, 4, resNIC, 2)
		},
	}, {
		// Tolerated: the first response is the container's, the rest ignored.
		name: "Allocate answers more container responses than asked", kind: kindRead, opts: requireGPU,
		run: func(t *testing.T, r *rig, seen observed) {
			p := r.register(r.plugin(resGPU, "gpu.sock", healthyDevices("d", 4)))
			p.SetAllocateFunc(func(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
				resp := p.DefaultAllocate(req)
				for i := range 2 {
					resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
						Envs:    map[string]string{"EXTRA": strconv.Itoa(i)},
						Devices: []*pluginapi.DeviceSpec{{ContainerPath: "/dev/extra", HostPath: "/dev/extra", Permissions: "rw"}},
					})
				}
				return resp, nil
			})
			pod := podOf("p", resGPU, 2)
			require.NoError(t, r.admit(pod))
			opts, err := r.m.GetDeviceRunContainerOptions(context.Background(), pod, &pod.Spec.Containers[0])
			require.NoError(t, err)
			require.NotNil(t, opts)
			ok := assert.Len(t, opts.Devices, 2, "the first response's devices only")
			for _, e := range opts.Envs {
				ok = assert.NotEqual(t, "EXTRA", e.Name) && ok
			}
			seen.saw(kindRead, ok)
		},
	}, {
		name: "Allocate fails", kind: kindRefused, opts: requireGPU,
		run: func(t *testing.T, r *rig, seen observed) {
			p := r.register(r.plugin(resGPU, "gpu.sock", healthyDevices("d", 4)))
			p.SetError(plugintest.MethodAllocate, status.Error(codes.Internal, "card on fire"))
			pod := podOf("p", resGPU, 3)
			err := r.admit(pod)
			seen.saw(kindRefused, assertRefused(t, r, pod, err, devicemanager.ErrPluginCall,
				"device plugin Allocate rpc for "+resGPU+" failed: rpc error: code = Internal desc = card on fire"))
			assert.Equal(t, codes.Internal, status.Code(err))
			p.SetError(plugintest.MethodAllocate, nil)
			requireAllFree(t, r, "all", resGPU, 4)
		},
	}, {
		// Tolerated: preferred IDs that are not candidates are ignored.
		name: "GetPreferredAllocation names devices never advertised", kind: kindRead, opts: requireGPU,
		run: func(t *testing.T, r *rig, seen observed) {
			p := r.register(r.plugin(resGPU, "gpu.sock", healthyDevices("d", 4), withPreferred))
			p.SetPreferredAllocationFunc(func(context.Context, *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
				return &pluginapi.PreferredAllocationResponse{ContainerResponses: []*pluginapi.ContainerPreferredAllocationResponse{
					{DeviceIDs: []string{"ghost", "", "d3", "d3", "../d1", "d0\x00", "D2"}},
				}}, nil
			})
			pod := podOf("p", resGPU, 2)
			require.NoError(t, r.admit(pod))
			held := r.held(pod, resGPU)
			assert.Len(t, held, 2)
			seen.saw(kindRead, assert.Contains(t, held, "d3", "the one advertised preferred device"))
			assert.Subset(t, []string{"d0", "d1", "d2", "d3"}, held)
			assert.Equal(t, [][]string{held}, allocateRequests(t, p))
			require.NoError(t, r.admit(podOf("q", resGPU, 2)), "the other two")
		},
	}, {
		name: "GetPreferredAllocation answers more devices than asked", kind: kindRead, opts: requireGPU,
		run: func(t *testing.T, r *rig, seen observed) {
			p := r.register(r.plugin(resGPU, "gpu.sock", healthyDevices("d", 4), withPreferred))
			p.SetPreferredAllocationFunc(func(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
				all := slices.Clone(req.ContainerRequests[0].AvailableDeviceIDs)
				slices.Reverse(all)
				return &pluginapi.PreferredAllocationResponse{ContainerResponses: []*pluginapi.ContainerPreferredAllocationResponse{
					{DeviceIDs: all}, {DeviceIDs: all},
				}}, nil
			})
			pod := podOf("p", resGPU, 1)
			require.NoError(t, r.admit(pod))
			seen.saw(kindRead, assert.Equal(t, []string{"d3"}, r.held(pod, resGPU), "the first preferred device, and only one"))
			assert.Equal(t, [][]string{{"d3"}}, allocateRequests(t, p))
		},
	}, {
		name: "GetPreferredAllocation fails", kind: kindRefused, opts: withMetrics(requireGPU),
		run: func(t *testing.T, r *rig, seen observed) {
			p := r.register(r.plugin(resGPU, "gpu.sock", healthyDevices("d", 4), withPreferred))
			p.SetError(plugintest.MethodGetPreferredAllocation, status.Error(codes.Unavailable, "thinking"))
			pod := podOf("p", resGPU, 2)
			require.NoError(t, r.admit(pod), "no preference: the manager picks")
			assert.Len(t, r.held(pod, resGPU), 2)
			assert.Len(t, p.CallsOf(plugintest.MethodAllocate), 1)
			seen.saw(kindRefused, assert.Equal(t, 1, rpcErrors(t, r, resGPU, plugintest.MethodGetPreferredAllocation),
				"the manager counts the failed call"))
		},
	}, {
		// Tolerated: the last entry of an ID wins; capacity counts IDs.
		name: "ListAndWatch lists duplicate device IDs", kind: kindRead, opts: requireGPU,
		run: func(t *testing.T, r *rig, seen observed) {
			devs := []*pluginapi.Device{
				device("d0", pluginapi.Healthy), device("d1", pluginapi.Healthy), device("d0", pluginapi.Unhealthy),
				device("d2", pluginapi.Healthy), device("d2", pluginapi.Healthy), device("d1", pluginapi.Healthy),
			}
			p := r.plugin(resGPU, "gpu.sock", devs)
			require.NoError(t, p.Register(r.kubeletSocket()))
			r.waitCapacity(resGPU, 3, 2)
			seen.saw(kindRead, assert.Equal(t, []string{"d1", "d2"}, ids(r.m.GetAllocatableDevices()[resGPU])))
			pod := podOf("p", resGPU, 2)
			require.NoError(t, r.admit(pod))
			assert.Equal(t, []string{"d1", "d2"}, r.held(pod, resGPU))
			late := podOf("late", resGPU, 1)
			assertRefused(t, r, late, r.admit(late), devicemanager.ErrInsufficientDevices,
				"requested number of devices unavailable for "+resGPU+". Requested: 1, Available: 0")
		},
	}, {
		// Tolerated: "" is an ID like any other.
		name: "ListAndWatch lists an empty device ID", kind: kindRead, opts: requireGPU,
		run: func(t *testing.T, r *rig, seen observed) {
			p := r.register(r.plugin(resGPU, "gpu.sock", []*pluginapi.Device{
				device("", pluginapi.Healthy), device("d1", pluginapi.Healthy),
			}))
			pod := podOf("p", resGPU, 2)
			require.NoError(t, r.admit(pod))
			seen.saw(kindRead, assert.Equal(t, []string{"", "d1"}, r.held(pod, resGPU)))
			assert.Equal(t, [][]string{{"", "d1"}}, allocateRequests(t, p))
		},
	}, {
		// Tolerated: node ids outside 0..63 are in no NUMA mask, so hints
		// and alignment ignore them; the record keeps them as reported, and
		// the checkpoint carries them through a restart.
		name: "ListAndWatch reports NUMA ids outside 0..63", kind: kindRead,
		opts: func(o *devicemanager.Options) { requireGPU(o); o.NUMANodes = []int{0, 1} },
		run: func(t *testing.T, r *rig, seen observed) {
			numa := map[string][]int64{
				"d0": {-5}, "d1": {64}, "d2": {0, 99}, "d3": {1 << 40}, "d4": {-1}, "d5": {math.MinInt64}, "d6": {1}, "d7": {math.MaxInt64, 0},
			}
			var devs []*pluginapi.Device
			for _, id := range slices.Sorted(maps.Keys(numa)) {
				devs = append(devs, device(id, pluginapi.Healthy, numa[id]...))
			}
			r.register(r.plugin(resGPU, "gpu.sock", devs))
			probe := podOf("probe", resGPU, 2)
			for _, h := range r.m.GetTopologyHints(probe, &probe.Spec.Containers[0])[resGPU] {
				if h.NUMANodeAffinity != nil {
					assert.Subset(t, []int{0, 1}, h.NUMANodeAffinity.GetBits(), "a hint names machine nodes only")
				}
			}
			all := podOf("all", resGPU, len(numa))
			require.NoError(t, r.admit(all))
			view := r.m.GetDevices("all", "c")[resGPU]
			require.Len(t, view, len(numa))
			for id, want := range numa {
				var got []int64
				for _, n := range view[id].GetTopology().GetNodes() {
					got = append(got, n.ID)
				}
				slices.Sort(want)
				if id == "d4" {
					want = nil // -1 is "no topology"
				}
				assert.Equal(t, want, got, id)
			}
			store, err := checkpoint.NewManager(r.dir)
			require.NoError(t, err)
			cp := checkpoint.New(nil, nil)
			require.NoError(t, store.GetCheckpoint(checkpoint.DeviceManagerKey, cp), "the checkpoint verifies")
			entries, _ := cp.GetData()
			var keys []int64
			for _, e := range entries {
				if e.PodUID == "all" {
					keys = slices.Sorted(maps.Keys(e.DeviceIDs))
				}
			}
			assert.Equal(t, []int64{math.MinInt64, -5, -1, 0, 1, 64, 99, 1 << 40, math.MaxInt64}, keys)
			r.restart()
			seen.saw(kindRead, assert.Equal(t, view, r.m.GetDevices("all", "c")[resGPU], "restored from the checkpoint"))
		},
	}, {
		name: "first ListAndWatch message above MaxRecvMsgSize", kind: kindRefused,
		opts: func(o *devicemanager.Options) { requireGPU(o); o.MaxRecvMsgSize = 4 << 10 },
		run: func(t *testing.T, r *rig, seen observed) {
			p := r.plugin(resGPU, "gpu.sock", bigList(200))
			require.NoError(t, p.Register(r.kubeletSocket()))
			seen.saw(kindRefused, r.waitErrorLog("ListAndWatch ended unexpectedly", "ResourceExhausted", "larger than max") != "")
			ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
			defer cancel()
			require.NoError(t, p.WaitForStreams(ctx, 0), "the manager ended the stream")
			c, _ := r.capacity(resGPU)
			assert.Equal(t, int64(-1), c, "not registered")
			pod := podOf("p", resGPU, 1)
			assertRefused(t, r, pod, r.admit(pod), devicemanager.ErrUnregisteredResource, "cannot allocate unregistered device "+resGPU)

			p.Update(healthyDevices("d", 4))
			r.register(p)
			requireAllFree(t, r, "all", resGPU, 4)
		},
	}, {
		name: "later ListAndWatch message above MaxRecvMsgSize", kind: kindRefused,
		opts: func(o *devicemanager.Options) { requireGPU(o); o.MaxRecvMsgSize = 4 << 10 },
		run: func(t *testing.T, r *rig, seen observed) {
			p := r.register(r.plugin(resGPU, "gpu.sock", healthyDevices("d", 4)))
			a := podOf("a", resGPU, 2)
			require.NoError(t, r.admit(a))
			held := r.held(a, resGPU)
			p.Update(bigList(200))
			seen.saw(kindRefused, r.waitErrorLog("ListAndWatch ended unexpectedly", "ResourceExhausted") != "")
			r.waitCapacity(resGPU, 4, 0)
			b := podOf("b", resGPU, 1)
			assertRefused(t, r, b, r.admit(b), devicemanager.ErrPluginNotReady,
				"no healthy devices present; cannot allocate unhealthy devices "+resGPU+": device plugin not ready")
			assert.Equal(t, held, r.held(a, resGPU))

			p.Update(healthyDevices("d", 4))
			r.register(p)
			rest := podOf("rest", resGPU, 2)
			require.NoError(t, r.admit(rest))
			for _, id := range r.held(rest, resGPU) {
				assert.NotContains(t, held, id)
			}
		},
	}, {
		// Tolerated, as the kubelet reads it: only the exact string
		// "Healthy" is healthy; every other string is unhealthy.
		name: "ListAndWatch reports health strings other than Healthy and Unhealthy", kind: kindRead, opts: requireGPU,
		run: func(t *testing.T, r *rig, seen observed) {
			p := r.plugin(resGPU, "gpu.sock", []*pluginapi.Device{
				device("d0", pluginapi.Healthy), device("d1", "healthy"), device("d2", ""), device("d3", "UNHEALTHY"),
				device("d4", "Sick"), device("d5", "Healthy "), device("d6", "\x00"), device("d7", "Healthy\n"),
			})
			require.NoError(t, p.Register(r.kubeletSocket()))
			r.waitCapacity(resGPU, 8, 1)
			seen.saw(kindRead, assert.Equal(t, []string{"d0"}, ids(r.m.GetAllocatableDevices()[resGPU])))
			two := podOf("two", resGPU, 2)
			assertRefused(t, r, two, r.admit(two), devicemanager.ErrInsufficientDevices,
				"requested number of devices unavailable for "+resGPU+". Requested: 2, Available: 1")
			one := podOf("one", resGPU, 1)
			require.NoError(t, r.admit(one))
			assert.Equal(t, []string{"d0"}, r.held(one, resGPU))
		},
	}, {
		name: "ListAndWatch fails when opened", kind: kindRefused, opts: requireGPU,
		run: func(t *testing.T, r *rig, seen observed) {
			p := r.plugin(resGPU, "gpu.sock", healthyDevices("d", 4))
			p.SetError(plugintest.MethodListAndWatch, status.Error(codes.Unavailable, "still probing"))
			require.NoError(t, p.Register(r.kubeletSocket()), "the stream opens after Register returns")
			seen.saw(kindRefused, r.waitErrorLog("ListAndWatch ended unexpectedly", "still probing") != "")
			c, _ := r.capacity(resGPU)
			assert.Equal(t, int64(-1), c, "not registered")
			pod := podOf("p", resGPU, 1)
			assertRefused(t, r, pod, r.admit(pod), devicemanager.ErrUnregisteredResource, "cannot allocate unregistered device "+resGPU)
			p.SetError(plugintest.MethodListAndWatch, nil)
			r.register(p)
			requireAllFree(t, r, "all", resGPU, 4)
		},
	}, {
		// A stream that ends cleanly is a plugin gone, as a crash is.
		name: "ListAndWatch stream ends with OK", kind: kindRead, opts: requireGPU,
		run: func(t *testing.T, r *rig, seen observed) {
			p := r.register(r.plugin(resGPU, "gpu.sock", healthyDevices("d", 4)))
			a := podOf("a", resGPU, 1)
			require.NoError(t, r.admit(a))
			p.CloseStreams()
			r.waitCapacity(resGPU, 4, 0)
			b := podOf("b", resGPU, 1)
			seen.saw(kindRead, assertRefused(t, r, b, r.admit(b), devicemanager.ErrPluginNotReady,
				"no healthy devices present; cannot allocate unhealthy devices "+resGPU+": device plugin not ready"))
			r.register(p)
			requireAllFree(t, r, "rest", resGPU, 3)
		},
	}, {
		name: "GetDevicePluginOptions fails", kind: kindRefused, opts: requireGPU,
		run: func(t *testing.T, r *rig, seen observed) {
			p := r.plugin(resGPU, "gpu.sock", healthyDevices("d", 4))
			p.SetError(plugintest.MethodGetDevicePluginOptions, status.Error(codes.Internal, "no options today"))
			err := r.registerWith(p, p.RegisterRequest())
			require.Error(t, err)
			assert.Equal(t, codes.Unknown, status.Code(err))
			seen.saw(kindRefused, assert.Contains(t, err.Error(),
				"failed to get device plugin options: "+p.SocketPath()+": rpc error: code = Internal desc = no options today"))
			c, _ := r.capacity(resGPU)
			assert.Equal(t, int64(-1), c, "not registered")
			assert.Zero(t, p.Streams())
			p.SetError(plugintest.MethodGetDevicePluginOptions, nil)
			r.register(p)
			requireAllFree(t, r, "all", resGPU, 4)
		},
	}, {
		name: "PreStartContainer fails", kind: kindRefused, opts: requireGPU,
		run: func(t *testing.T, r *rig, seen observed) {
			p := r.register(r.plugin(resGPU, "gpu.sock", healthyDevices("d", 4), withPreStart))
			a := podOf("a", resGPU, 2)
			require.NoError(t, r.admit(a))
			held := r.held(a, resGPU)
			p.SetError(plugintest.MethodPreStartContainer, status.Error(codes.FailedPrecondition, "device busy"))
			_, err := r.m.GetDeviceRunContainerOptions(context.Background(), a, &a.Spec.Containers[0])
			require.ErrorIs(t, err, devicemanager.ErrPluginCall)
			seen.saw(kindRefused, assert.EqualError(t, err,
				"device plugin PreStartContainer rpc failed with err: rpc error: code = FailedPrecondition desc = device busy"))
			assert.Equal(t, held, r.held(a, resGPU), "the admission stands")
			p.SetError(plugintest.MethodPreStartContainer, nil)
			opts, err := r.m.GetDeviceRunContainerOptions(context.Background(), a, &a.Spec.Containers[0])
			require.NoError(t, err)
			require.NotNil(t, opts)
			assert.Len(t, opts.Devices, 2)
		},
	}}
}

// bigList returns n healthy devices with 48-byte IDs: about 50 bytes each
// on the wire.
func bigList(n int) []*pluginapi.Device {
	out := make([]*pluginapi.Device, n)
	for i := range out {
		out[i] = device(strings.Repeat("x", 40)+strconv.Itoa(100000+i), pluginapi.Healthy)
	}
	return out
}

// allocateRequests returns the device IDs of every Allocate call p received.
func allocateRequests(t *testing.T, p *plugintest.Plugin) [][]string {
	t.Helper()
	var out [][]string
	for _, c := range p.CallsOf(plugintest.MethodAllocate) {
		req, ok := c.Request.(*pluginapi.AllocateRequest)
		require.True(t, ok)
		for _, cr := range req.ContainerRequests {
			out = append(out, cr.DevicesIds)
		}
	}
	return out
}

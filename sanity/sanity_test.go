package sanity_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/plugintest"
	"github.com/openkubelet/devmgr/podinfo"
	"github.com/openkubelet/devmgr/sanity"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const resource = "example.com/gpu"

// fixture is a plugin under check built on plugintest: a correct device
// plugin unless a test changes it. Like a real plugin, it registers again
// (as a new process would: a new Plugin) whenever kubelet.sock is created.
type fixture struct {
	opts plugintest.Options
	// hooks is applied to every Plugin the fixture starts.
	hooks func(p *plugintest.Plugin)
	// register registers p; default p.Register.
	register   func(p *plugintest.Plugin, kubeletSocket string) error
	reregister bool

	mu      sync.Mutex
	plugins []*plugintest.Plugin
}

func newFixture() *fixture {
	return &fixture{
		opts: plugintest.Options{
			ResourceName: resource,
			Devices: []*pluginapi.Device{
				{ID: "gpu-0", Health: pluginapi.Healthy, Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: 0}}}},
				{ID: "gpu-1", Health: pluginapi.Healthy},
				{ID: "gpu-2", Health: pluginapi.Healthy},
			},
			PreStartRequired:                true,
			GetPreferredAllocationAvailable: true,
			CDIDeviceName:                   func(id string) string { return resource + "=" + id },
			// The fixture plays a restarted plugin process itself: a new
			// Plugin per kubelet.sock.
			NoReregister: true,
		},
		reregister: true,
	}
}

// refuseUnknown is the Allocate of a correct plugin, plugintest's own: an
// error for devices it never listed, DefaultAllocate for the others. Hooks
// that break one rule wrap it.
func refuseUnknown(p *plugintest.Plugin) plugintest.AllocateFunc {
	return func(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
		if err := p.CheckListed(req); err != nil {
			return nil, err
		}
		return p.DefaultAllocate(req), nil
	}
}

func (f *fixture) current() *plugintest.Plugin {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.plugins[len(f.plugins)-1]
}

// launch starts a new Plugin in dir and registers it.
func (f *fixture) launch(dir string) error {
	opts := f.opts
	opts.SocketDir = dir
	p, err := plugintest.New(opts)
	if err != nil {
		return err
	}
	if f.hooks != nil {
		f.hooks(p)
	}
	f.mu.Lock()
	f.plugins = append(f.plugins, p)
	f.mu.Unlock()
	if err := p.Start(); err != nil {
		return err
	}
	register := f.register
	if register == nil {
		register = (*plugintest.Plugin).Register
	}
	return register(p, filepath.Join(dir, "kubelet.sock"))
}

// start is the StartPlugin of the configuration: it launches the plugin and
// a watch that launches it again each time kubelet.sock is created. Both
// end with the test.
func (f *fixture) start(t *testing.T) func(dir string) error {
	return func(dir string) error {
		t.Cleanup(func() {
			f.mu.Lock()
			defer f.mu.Unlock()
			for _, p := range f.plugins {
				p.Stop()
			}
		})
		if f.reregister {
			w, err := fsnotify.NewWatcher()
			if err != nil {
				return err
			}
			if err := w.Add(dir); err != nil {
				_ = w.Close()
				return err
			}
			done := make(chan struct{})
			t.Cleanup(func() { _ = w.Close(); <-done })
			go func() {
				defer close(done)
				for ev := range w.Events {
					if ev.Has(fsnotify.Create) && filepath.Base(ev.Name) == "kubelet.sock" {
						// A kubelet that restarts has ended its streams.
						ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
						err := f.current().WaitForStreams(ctx, 0)
						cancel()
						if err != nil {
							t.Errorf("kubelet.sock is served again while the old kubelet's stream is open: %v", err)
						}
						if err := f.launch(dir); err != nil {
							t.Errorf("plugin restart: %v", err)
						}
					}
				}
			}()
		}
		return f.launch(dir)
	}
}

func (f *fixture) config(t *testing.T) sanity.Config {
	return sanity.Config{
		StartPlugin: f.start(t),
		NUMANodes:   []int{0},
		TriggerUpdate: func(context.Context) error {
			p := f.current()
			p.Update(p.Devices())
			return nil
		},
		RegisterTimeout:   10 * time.Second,
		ReregisterTimeout: 10 * time.Second,
	}
}

func results(rep sanity.Report) map[string]sanity.Result {
	m := map[string]sanity.Result{}
	for _, r := range rep.Results {
		m[r.Name] = r
	}
	return m
}

// A correct plugin passes every check, each named in the report in order.
func TestCorrectPluginPassesEveryCheck(t *testing.T) {
	f := newFixture()
	rep, err := sanity.Run(t.Context(), f.config(t))
	require.NoError(t, err)
	assert.Equal(t, resource, rep.Resource)
	assert.Equal(t, "example.com-gpu.sock", rep.Endpoint)
	var names []string
	for _, r := range rep.Results {
		names = append(names, r.Name)
		assert.Equal(t, sanity.Passed, r.Status, "%s: %q", r.Name, r.Messages)
	}
	assert.Equal(t, sanity.Checks(), names)
	assert.True(t, rep.Passed())
	assert.Len(t, f.plugins, 2, "the plugin registered again after the restart")
}

// plugintest's defaults make a plugin that passes every check its options
// let run, restart/re-register included: no hook, and one Register, as a
// plugin's main would do.
func TestPlugintestPassesEveryCheck(t *testing.T) {
	for _, advertise := range []bool{true, false} {
		var p *plugintest.Plugin
		rep, err := sanity.Run(t.Context(), sanity.Config{
			StartPlugin: func(dir string) error {
				var err error
				p, err = plugintest.New(plugintest.Options{
					ResourceName: resource,
					SocketDir:    dir,
					Devices: []*pluginapi.Device{
						{ID: "gpu-0", Health: pluginapi.Healthy, Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: 0}}}},
						{ID: "gpu-1", Health: pluginapi.Healthy},
					},
					PreStartRequired:                advertise,
					GetPreferredAllocationAvailable: advertise,
					CDIDeviceName:                   func(id string) string { return resource + "=" + id },
				})
				if err != nil {
					return err
				}
				t.Cleanup(p.Stop)
				if err := p.Start(); err != nil {
					return err
				}
				return p.Register(filepath.Join(dir, "kubelet.sock"))
			},
			TriggerUpdate: func(context.Context) error {
				p.Update(p.Devices())
				return nil
			},
			NUMANodes:         []int{0},
			RegisterTimeout:   10 * time.Second,
			ReregisterTimeout: 10 * time.Second,
		})
		require.NoError(t, err)
		for _, r := range rep.Results {
			want := sanity.Passed
			if !advertise && (strings.HasPrefix(r.Name, "preferred-allocation/") || r.Name == "pre-start/answered") {
				want = sanity.Skipped
			}
			assert.Equal(t, want, r.Status, "advertised %v, %s: %q", advertise, r.Name, r.Messages)
		}
		assert.Len(t, p.CallsOf(plugintest.MethodGetDevicePluginOptions), 2, "registered twice: first, and after the restart")
	}
}

// A plugin that breaks one rule fails the check of that rule, with a
// message that names the rule and what the plugin sent; the other checks
// pass, but for those that the broken rule makes impossible (also).
func TestEachCheckFailsOnItsBrokenPlugin(t *testing.T) {
	badDevices := func(f *fixture, devs ...*pluginapi.Device) { f.opts.Devices = devs }
	cases := []struct {
		check     string
		breakRule func(f *fixture, cfg *sanity.Config)
		want      string   // in the check's messages
		also      []string // checks that may fail too
	}{{
		check: "registration/version",
		breakRule: func(f *fixture, _ *sanity.Config) {
			f.register = func(p *plugintest.Plugin, sock string) error {
				req := p.RegisterRequest()
				req.Version = "v1alpha"
				_ = p.RegisterWith(context.Background(), sock, req) // refused, as it should be
				return nil
			}
		},
		want: `supported API version: RegisterRequest.Version is "v1alpha"`,
	}, {
		check: "registration/resource-name",
		breakRule: func(f *fixture, _ *sanity.Config) {
			f.opts.ResourceName = "gpu"
			f.register = func(p *plugintest.Plugin, sock string) error {
				_ = p.Register(sock) // refused, as it should be
				return nil
			}
		},
		want: `extended resource name: RegisterRequest.ResourceName is "gpu"`,
	}, {
		check: "registration/endpoint",
		breakRule: func(f *fixture, _ *sanity.Config) {
			f.register = func(p *plugintest.Plugin, sock string) error {
				req := p.RegisterRequest()
				req.Endpoint = "elsewhere.sock"
				_ = p.RegisterWith(context.Background(), sock, req)
				return nil
			}
		},
		want: `endpoint serves the device plugin: RegisterRequest.Endpoint is "elsewhere.sock": failed to dial device plugin: no unix socket at`,
		also: []string{".*"}, // nothing can be reached
	}, {
		check: "registration/options",
		breakRule: func(f *fixture, _ *sanity.Config) {
			f.opts.RegistrationOptions = &pluginapi.DevicePluginOptions{PreStartRequired: false, GetPreferredAllocationAvailable: true}
		},
		want: "registered options agree: RegisterRequest.Options is {PreStartRequired: false, GetPreferredAllocationAvailable: true}, GetDevicePluginOptions answers {PreStartRequired: true, GetPreferredAllocationAvailable: true}",
	}, {
		check: "list-and-watch/first-list",
		breakRule: func(f *fixture, cfg *sanity.Config) {
			badDevices(f)
			// The first, empty, list must arrive in time; the suite waits
			// ListTimeout for a device once.
			cfg.ListTimeout = 2 * time.Second
		},
		want: "lists a device: no list with a device within 2s (1 lists received)",
		also: []string{"list-and-watch/.*", "preferred-allocation/.*", "allocate/.*", "pre-start/.*", "concurrency/.*", "restart/.*"},
	}, {
		check: "list-and-watch/update",
		breakRule: func(_ *fixture, cfg *sanity.Config) {
			cfg.TriggerUpdate = func(context.Context) error { return nil } // the plugin sends nothing
			// The lists the other checks need must arrive within it.
			cfg.ListTimeout = 2 * time.Second
		},
		want: "new list after a change: no ListAndWatch message within 2s of TriggerUpdate",
	}, {
		check: "list-and-watch/device-ids",
		breakRule: func(f *fixture, _ *sanity.Config) {
			badDevices(f, &pluginapi.Device{ID: "gpu-0", Health: pluginapi.Healthy}, &pluginapi.Device{ID: "gpu-0", Health: pluginapi.Healthy})
		},
		want: `unique, non-empty device IDs: list 1 has device "gpu-0" twice`,
	}, {
		check: "list-and-watch/health",
		breakRule: func(f *fixture, _ *sanity.Config) {
			badDevices(f, &pluginapi.Device{ID: "gpu-0", Health: pluginapi.Healthy}, &pluginapi.Device{ID: "gpu-1", Health: "Sick"})
		},
		want: `health Healthy or Unhealthy: list 1: device "gpu-1" has health "Sick"`,
	}, {
		check: "list-and-watch/topology",
		breakRule: func(f *fixture, _ *sanity.Config) {
			badDevices(f, &pluginapi.Device{ID: "gpu-0", Health: pluginapi.Healthy,
				Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: 7}}}})
		},
		want: `topology names NUMA nodes of this machine: list 1: device "gpu-0" names NUMA node 7; this machine has [0]`,
	}, {
		check: "preferred-allocation/subset",
		breakRule: func(f *fixture, _ *sanity.Config) {
			f.hooks = preferring("gpu-0", "gpu-9")
		},
		want: `a subset of the available devices: preferred ["gpu-0" "gpu-9"] from available ["gpu-0" "gpu-1" "gpu-2"]`,
	}, {
		check:     "preferred-allocation/must-include",
		breakRule: func(f *fixture, _ *sanity.Config) { f.hooks = preferring("gpu-1", "gpu-2") },
		want:      `every must-include device: preferred ["gpu-1" "gpu-2"] without must-include "gpu-0"`,
	}, {
		check:     "preferred-allocation/size",
		breakRule: func(f *fixture, _ *sanity.Config) { f.hooks = preferring("gpu-0") },
		want:      `the requested size: preferred 1 devices ["gpu-0"] for allocation size 2`,
	}, {
		check: "allocate/responses",
		breakRule: func(f *fixture, _ *sanity.Config) {
			f.hooks = editAllocate(func(r *pluginapi.AllocateResponse) { r.ContainerResponses = r.ContainerResponses[:1] })
		},
		want: "one response per container request: 2 container requests, 1 responses",
	}, {
		check: "allocate/device-specs",
		breakRule: func(f *fixture, _ *sanity.Config) {
			f.hooks = editAllocate(func(r *pluginapi.AllocateResponse) { r.ContainerResponses[0].Devices[0].HostPath = "dev/gpu" })
		},
		want: `device specs with absolute paths and permissions of r, w, m: DeviceSpec{ContainerPath: "/dev/plugintest/example.com_gpu/gpu-0", HostPath: "dev/gpu", Permissions: "rw"}`,
		also: []string{"concurrency/allocate"},
	}, {
		check: "allocate/envs",
		breakRule: func(f *fixture, _ *sanity.Config) {
			f.hooks = editAllocate(func(r *pluginapi.AllocateResponse) { r.ContainerResponses[0].Envs["GPU LIST"] = "x" })
		},
		want: `valid environment variable names: Envs["GPU LIST"]`,
		also: []string{"concurrency/allocate"},
	}, {
		check:     "allocate/cdi",
		breakRule: func(f *fixture, _ *sanity.Config) { f.opts.CDIDeviceName = func(id string) string { return id } },
		want:      `CDI device names that parse (vendor/class=name): CDIDevice{Name: "gpu-0"}`,
		also:      []string{"concurrency/allocate"},
	}, {
		check: "allocate/mounts",
		breakRule: func(f *fixture, _ *sanity.Config) {
			f.hooks = editAllocate(func(r *pluginapi.AllocateResponse) { r.ContainerResponses[0].Mounts[0].ContainerPath = "run/gpu" })
		},
		want: `mounts with absolute paths: Mount{ContainerPath: "run/gpu"`,
		also: []string{"concurrency/allocate"},
	}, {
		check: "allocate/unknown-device",
		breakRule: func(f *fixture, _ *sanity.Config) {
			f.hooks = func(p *plugintest.Plugin) {
				p.SetAllocateFunc(func(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
					return p.DefaultAllocate(req), nil // grants whatever is asked
				})
			}
		},
		want: `unknown device refused: Allocate of "sanity-unknown-device", a device the plugin never listed, answered 1 container responses and no error`,
	}, {
		check: "pre-start/answered",
		breakRule: func(f *fixture, _ *sanity.Config) {
			f.hooks = func(p *plugintest.Plugin) {
				p.SetError(plugintest.MethodPreStartContainer, errors.New("no such device"))
			}
		},
		want: `answers PreStartContainer: PreStartContainer of ["gpu-0"]: rpc error: code = Unknown desc = no such device`,
	}, {
		check: "concurrency/allocate",
		breakRule: func(f *fixture, _ *sanity.Config) {
			f.hooks = func(p *plugintest.Plugin) { p.SetAllocateFunc(oneAtATime(refuseUnknown(p))) }
		},
		want: "8 concurrent Allocate calls answered: call",
	}, {
		check: "restart/re-register",
		breakRule: func(f *fixture, cfg *sanity.Config) {
			f.reregister = false
			cfg.ReregisterTimeout = 300 * time.Millisecond
		},
		want: "registers again after the kubelet restarts: no registration of example.com/gpu within 300ms of kubelet.sock being re-created",
	}, {
		check: "restart/re-register",
		breakRule: func(f *fixture, _ *sanity.Config) {
			first := true
			f.hooks = func(p *plugintest.Plugin) {
				if !first {
					p.Update(p.Devices()[:2]) // comes back without gpu-2
				}
				first = false
			}
		},
		want: "same devices after the restart: healthy devices before gpu-0,gpu-1,gpu-2, after gpu-0,gpu-1",
	}}
	var covered []string
	for _, tc := range cases {
		covered = append(covered, tc.check)
	}
	assert.Equal(t, sanity.Checks(), slices.Compact(covered), "one broken plugin, at least, per check, in the order they run")
	for _, tc := range cases {
		t.Run(tc.check, func(t *testing.T) {
			f := newFixture()
			cfg := f.config(t)
			tc.breakRule(f, &cfg)
			rep, err := sanity.Run(t.Context(), cfg)
			require.NoError(t, err)
			got := results(rep)
			require.Contains(t, got, tc.check)
			assert.Equal(t, sanity.Failed, got[tc.check].Status)
			assert.Contains(t, strings.Join(got[tc.check].Messages, "\n"), tc.want)
			assert.False(t, rep.Passed())
			for _, r := range rep.Results {
				if r.Name == tc.check || slices.ContainsFunc(tc.also, func(p string) bool { return matches(p, r.Name) }) {
					continue
				}
				assert.Equal(t, sanity.Passed, r.Status, "%s: %q", r.Name, r.Messages)
			}
		})
	}
}

func matches(pattern, name string) bool {
	ok, _ := filepath.Match(strings.ReplaceAll(pattern, ".*", "*"), name)
	return ok || pattern == ".*"
}

// preferring makes GetPreferredAllocation answer ids.
func preferring(ids ...string) func(*plugintest.Plugin) {
	return func(p *plugintest.Plugin) {
		p.SetPreferredAllocationFunc(func(context.Context, *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
			return &pluginapi.PreferredAllocationResponse{ContainerResponses: []*pluginapi.ContainerPreferredAllocationResponse{{DeviceIDs: ids}}}, nil
		})
	}
}

// editAllocate makes Allocate answer the correct response after edit.
func editAllocate(edit func(*pluginapi.AllocateResponse)) func(*plugintest.Plugin) {
	return func(p *plugintest.Plugin) {
		correct := refuseUnknown(p)
		p.SetAllocateFunc(func(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
			resp, err := correct(ctx, req)
			if err == nil {
				edit(resp)
			}
			return resp, err
		})
	}
}

// oneAtATime wraps an Allocate that cannot take two calls at once: a call
// for gpu-1 or gpu-2 alone (only the concurrency check makes those) holds
// the plugin until a second arrives, which is refused as busy. Other calls
// are answered at once.
func oneAtATime(next plugintest.AllocateFunc) plugintest.AllocateFunc {
	var busy atomic.Bool
	second := make(chan struct{})
	var once sync.Once
	return func(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
		if len(req.ContainerRequests) != 1 || len(req.ContainerRequests[0].DevicesIds) != 1 ||
			!slices.Contains([]string{"gpu-1", "gpu-2"}, req.ContainerRequests[0].DevicesIds[0]) {
			return next(ctx, req)
		}
		if !busy.CompareAndSwap(false, true) {
			once.Do(func() { close(second) })
			return nil, errors.New("busy: one allocation at a time")
		}
		defer busy.Store(false)
		select {
		case <-second:
		case <-ctx.Done():
		}
		return next(ctx, req)
	}
}

// Run fails, and checks nothing, when no plugin registers in time, naming
// what did register.
func TestRunWithoutRegistration(t *testing.T) {
	dir, err := os.MkdirTemp("", "sn")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	_, err = sanity.Run(t.Context(), sanity.Config{SocketDir: dir, RegisterTimeout: 200 * time.Millisecond, NUMANodes: []int{0}})
	require.ErrorContains(t, err, "sanity: a device plugin did not register in "+dir+" within 200ms")
	require.ErrorIs(t, err, sanity.ErrNotRegistered)

	// Stopped by its caller while it waits, it says so.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err = sanity.Run(ctx, sanity.Config{SocketDir: dir, NUMANodes: []int{0}})
	require.ErrorContains(t, err, "sanity: stopped while waiting for a registration: context canceled")
	require.NotErrorIs(t, err, sanity.ErrNotRegistered)

	f := newFixture()
	cfg := f.config(t)
	cfg.ResourceName = "example.com/fpga"
	cfg.RegisterTimeout = 300 * time.Millisecond
	_, err = sanity.Run(t.Context(), cfg)
	require.ErrorContains(t, err, `a device plugin for example.com/fpga did not register`)
	require.ErrorContains(t, err, `registered: ["example.com/gpu"]`)
	require.ErrorIs(t, err, sanity.ErrNotRegistered)
}

// Run refuses a directory whose kubelet.sock something serves: it never
// takes over a kubelet's directory.
func TestRunRefusesALiveKubeletSocket(t *testing.T) {
	f := newFixture()
	cfg := f.config(t)
	dir, err := os.MkdirTemp("", "sn")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	cfg.SocketDir = dir
	other := newFixture()
	otherCfg := other.config(t)
	otherCfg.SocketDir = dir
	done := make(chan struct{})
	otherCfg.StartPlugin = func(d string) error {
		defer close(done)
		_, err := sanity.Run(t.Context(), cfg) // while the first serves kubelet.sock
		assert.ErrorContains(t, err, "kubelet.sock accepts connections")
		assert.NotErrorIs(t, err, sanity.ErrNotRegistered)
		return other.start(t)(d)
	}
	_, err = sanity.Run(t.Context(), otherCfg)
	require.NoError(t, err)
	<-done
}

// A plugin that registers again, as a new process on a new socket, is
// checked on its newest registration, as the kubelet follows it.
func TestFollowsThePluginsNewestRegistration(t *testing.T) {
	f := newFixture()
	cfg := f.config(t)
	f.opts.Endpoint = "first.sock"
	first := true
	f.register = func(p *plugintest.Plugin, sock string) error {
		if err := p.Register(sock); err != nil || !first {
			return err
		}
		first = false
		f.opts.Endpoint = "second.sock"
		err := f.launch(filepath.Dir(sock))
		p.Stop()
		return err
	}
	rep, err := sanity.Run(t.Context(), cfg)
	require.NoError(t, err)
	for _, r := range rep.Results {
		assert.Equal(t, sanity.Passed, r.Status, "%s: %q", r.Name, r.Messages)
	}
	assert.Equal(t, "second.sock", rep.Endpoint)
}

// A client that connects to kubelet.sock and sends nothing holds neither
// the restart check nor the end of the run past CallTimeout.
func TestSilentKubeletClientHoldsNothing(t *testing.T) {
	f := newFixture()
	cfg := f.config(t)
	cfg.CallTimeout = time.Second
	start := cfg.StartPlugin
	cfg.StartPlugin = func(dir string) error {
		conn, err := net.Dial("unix", filepath.Join(dir, "kubelet.sock"))
		if err != nil {
			return err
		}
		t.Cleanup(func() { conn.Close() })
		return start(dir)
	}
	done := make(chan sanity.Report)
	go func() {
		rep, err := sanity.Run(t.Context(), cfg)
		assert.NoError(t, err)
		done <- rep
	}()
	select {
	case rep := <-done:
		assert.True(t, rep.Passed(), "%+v", rep.Results)
	case <-time.After(60 * time.Second): // gRPC would wait 120s for the handshake
		t.Fatal("Run is held by a client that sends nothing")
	}
}

// A plugin of shared devices, which gives one device per container and
// refuses more, passes every check with MaxDevicesPerContainer 1; asked
// for two, its preferred allocation is refused.
func TestOneDevicePerContainer(t *testing.T) {
	oneEach := func(p *plugintest.Plugin) {
		correct := refuseUnknown(p)
		p.SetAllocateFunc(func(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
			for _, cr := range req.ContainerRequests {
				if len(cr.DevicesIds) > 1 {
					return nil, errors.New("maximum request size for shared resources is 1")
				}
			}
			return correct(ctx, req)
		})
		p.SetPreferredAllocationFunc(func(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
			for _, cr := range req.ContainerRequests {
				if cr.AllocationSize > 1 {
					return nil, errors.New("maximum request size for shared resources is 1")
				}
			}
			return p.DefaultPreferredAllocation(req), nil
		})
	}
	for _, maxDevices := range []int{1, 0} {
		f := newFixture()
		f.hooks = oneEach
		cfg := f.config(t)
		cfg.MaxDevicesPerContainer = maxDevices
		rep, err := sanity.Run(t.Context(), cfg)
		require.NoError(t, err)
		for _, r := range rep.Results {
			want := sanity.Passed
			if maxDevices == 0 && strings.HasPrefix(r.Name, "preferred-allocation/") {
				want = sanity.Failed
			}
			assert.Equal(t, want, r.Status, "MaxDevicesPerContainer %d, %s: %q", maxDevices, r.Name, r.Messages)
		}
	}
}

// ResourceName picks one of the resources registered in the directory.
func TestResourceNamePicksOneOfSeveral(t *testing.T) {
	gpu, fpga := newFixture(), newFixture()
	// The gpu plugin only registers first. Were it to register again after
	// the restart check, as the checked plugin does, its registration could
	// still be on its way when the run ends and removes kubelet.sock.
	gpu.reregister = false
	fpga.opts.ResourceName = "example.com/fpga"
	fpga.opts.CDIDeviceName = func(id string) string { return "example.com/fpga=" + id }
	cfg := fpga.config(t)
	cfg.ResourceName = "example.com/fpga"
	startFPGA := cfg.StartPlugin
	cfg.StartPlugin = func(dir string) error {
		if err := gpu.start(t)(dir); err != nil { // registers first
			return err
		}
		return startFPGA(dir)
	}
	rep, err := sanity.Run(t.Context(), cfg)
	require.NoError(t, err)
	assert.Equal(t, "example.com/fpga", rep.Resource)
	assert.True(t, rep.Passed(), "%+v", rep.Results)
	assert.Len(t, fpga.plugins, 2, "the checked plugin registered again after the restart")
}

// A plugin that lists no device fails every check that needs one, naming
// why; the first such check waited ListTimeout for a device.
func TestPluginWithoutDevicesFailsTheDeviceChecks(t *testing.T) {
	f := newFixture()
	f.opts.Devices = nil
	cfg := f.config(t)
	cfg.ListTimeout = 3 * time.Second
	rep, err := sanity.Run(t.Context(), cfg)
	require.NoError(t, err)
	var failed []string
	for _, r := range rep.Results {
		if r.Status == sanity.Failed {
			failed = append(failed, r.Name)
			assert.Equal(t, []string{"lists a device: no list with a device within 3s (1 lists received): the allocation checks need one"},
				r.Messages, r.Name)
		} else {
			assert.Equal(t, sanity.Passed, r.Status, "%s: %q", r.Name, r.Messages)
		}
	}
	assert.Equal(t, []string{"list-and-watch/first-list", "list-and-watch/update", "preferred-allocation/subset",
		"preferred-allocation/must-include", "preferred-allocation/size", "allocate/responses", "allocate/device-specs",
		"allocate/envs", "allocate/cdi", "allocate/mounts", "allocate/unknown-device", "pre-start/answered",
		"concurrency/allocate", "restart/re-register"}, failed)
	assert.GreaterOrEqual(t, results(rep)["list-and-watch/first-list"].Duration, cfg.ListTimeout, "it waited for a device")
}

// With PodInfo, every call a device manager names a pod in carries it, so
// that a plugin that reads it can be checked; without it, none does.
func TestPodInfoReachesThePlugin(t *testing.T) {
	info := podinfo.Info{Kind: podinfo.KindPod, Namespace: "ns", Name: "pod", UID: "uid", Container: "c"}
	for _, send := range []bool{true, false} {
		f := newFixture()
		cfg := f.config(t)
		cfg.Skip = regexp.MustCompile(`^restart/`)
		if send {
			cfg.PodInfo = &info
		}
		rep, err := sanity.Run(t.Context(), cfg)
		require.NoError(t, err)
		require.True(t, rep.Passed())
		for _, m := range []plugintest.Method{plugintest.MethodAllocate, plugintest.MethodGetPreferredAllocation, plugintest.MethodPreStartContainer} {
			calls := f.current().CallsOf(m)
			require.NotEmpty(t, calls, "%s", m)
			for _, c := range calls {
				got, ok := c.PodInfo()
				assert.Equal(t, send, ok, "PodInfo set: %v, %s", send, m)
				if send {
					assert.Equal(t, info, got, "%s", m)
				}
			}
		}
	}
}

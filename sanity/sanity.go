package sanity

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openkubelet/devmgr/podinfo"
	"github.com/openkubelet/devmgr/topology"
)

// Config says which plugin to check and how long to wait for it. Only
// SocketDir or StartPlugin is needed; every other field has a default.
type Config struct {
	// SocketDir is the directory the suite serves kubelet.sock in, where the
	// plugin under test puts its socket. Empty: a new temporary directory,
	// removed at the end, which the plugin learns from StartPlugin.
	SocketDir string
	// StartPlugin starts the plugin under test once kubelet.sock is served
	// in socketDir; the plugin registers by itself. The caller stops it.
	// Nil: the plugin runs already, or is started separately, and watches
	// SocketDir as it would on a node.
	StartPlugin func(socketDir string) error
	// ResourceName is the resource to check when the plugin registers
	// several. Empty: the first to register.
	ResourceName string
	// TriggerUpdate makes the plugin send a new device list (a device turns
	// unhealthy, one is added). The list-and-watch/update check runs only
	// when it is set.
	TriggerUpdate func(ctx context.Context) error
	// NUMANodes are the NUMA node ids a device's topology may name. Nil:
	// this machine's.
	NUMANodes []int
	// Skip skips the checks whose names (such as "allocate/cdi") it matches.
	Skip *regexp.Regexp
	// RegisterTimeout bounds the wait for the first registration (default
	// 30s); ReregisterTimeout the wait for the registration after the
	// kubelet restarts (default 60s); ListTimeout the wait for a device list
	// (default 10s); PreStartTimeout PreStartContainer (default 30s, the
	// kubelet's); CallTimeout every other call (default 10s), and
	// Parallel times it the concurrent calls together.
	RegisterTimeout, ReregisterTimeout, ListTimeout, PreStartTimeout, CallTimeout time.Duration
	// Parallel is the number of concurrent Allocate calls of the
	// concurrency check (default 8).
	Parallel int
	// MaxDevicesPerContainer is the most devices the plugin gives one
	// container (1 for a plugin of shared devices that refuses more).
	// Default 2, the most any check asks for.
	MaxDevicesPerContainer int
	// Progress, when set, is told what the suite does as it goes: that it
	// waits for a registration, which plugin registered, and each check as
	// it starts and ends. It is called from the goroutine of Run.
	Progress func(Progress)
	// PodInfo, when set, is sent in the metadata of every Allocate,
	// GetPreferredAllocation and PreStartContainer call, as a device manager
	// with Options.SendPodInfo names the pod of the call, for plugins that
	// read it (package podinfo). Nil: no metadata, as the kubelet sends.
	PodInfo *podinfo.Info
}

func (c Config) withDefaults() (Config, error) {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.RegisterTimeout, 30*time.Second)
	def(&c.ReregisterTimeout, 60*time.Second)
	def(&c.ListTimeout, 10*time.Second)
	def(&c.PreStartTimeout, 30*time.Second)
	def(&c.CallTimeout, 10*time.Second)
	if c.Parallel <= 0 {
		c.Parallel = 8
	}
	if c.MaxDevicesPerContainer <= 0 {
		c.MaxDevicesPerContainer = 2
	}
	if c.NUMANodes == nil {
		nodes, err := topology.Discover("/")
		if err != nil {
			return c, err
		}
		c.NUMANodes = nodes
	}
	if c.SocketDir == "" && c.StartPlugin == nil {
		return c, errors.New("sanity: Config needs SocketDir, StartPlugin, or both")
	}
	return c, nil
}

// Progress is one step of a run; one field is set.
type Progress struct {
	// Waiting is the kubelet.sock the suite serves while it waits for a
	// plugin to register.
	Waiting string
	// Registered is the resource name of the plugin that registered.
	Registered string
	// Started names a check that starts.
	Started string
	// Done is the result of a check that ended (or was skipped).
	Done *Result
}

// progress tells cfg.Progress of p, if set.
func (c Config) progress(p Progress) {
	if c.Progress != nil {
		c.Progress(p)
	}
}

// Status is the outcome of one check.
type Status string

// The outcomes of a check.
const (
	Passed  Status = "passed"
	Failed  Status = "failed"
	Skipped Status = "skipped"
)

// Result is what one check found.
type Result struct {
	// Name is the check's name, "group/check".
	Name   string
	Status Status
	// Messages are the rules the plugin broke, each with what it sent, or
	// why the check was skipped.
	Messages []string
	Duration time.Duration
}

// Report is what Run found.
type Report struct {
	// Resource and Endpoint are what the checked plugin registered last.
	Resource, Endpoint string
	Results            []Result
}

// Passed reports whether no check failed.
func (r Report) Passed() bool {
	return !slices.ContainsFunc(r.Results, func(x Result) bool { return x.Status == Failed })
}

// Checks returns the names of the checks, in the order they run.
func Checks() []string {
	names := make([]string, len(checks))
	for i, c := range checks {
		names[i] = c.name
	}
	return names
}

// Run checks a plugin and reports every check's result. It returns an error,
// and no report, when no plugin could be checked: the directory is in use,
// the plugin does not register in time (ErrNotRegistered), StartPlugin
// fails.
func Run(ctx context.Context, cfg Config) (Report, error) {
	s, err := start(ctx, cfg)
	if err != nil {
		return Report{}, err
	}
	defer s.close()
	var rep Report
	for _, c := range checks {
		if s.cfg.Skip != nil && s.cfg.Skip.MatchString(c.name) {
			rep.Results = append(rep.Results, Result{Name: c.name, Status: Skipped, Messages: []string{"skipped by the configuration"}})
			s.cfg.progress(Progress{Done: &rep.Results[len(rep.Results)-1]})
			continue
		}
		s.cfg.progress(Progress{Started: c.name})
		s.follow()
		r := &recorder{}
		begin := time.Now()
		done := make(chan struct{})
		go func() { // a goroutine, so that a check can stop with runtime.Goexit
			defer close(done)
			c.run(s, &C{ctx: ctx, t: r})
		}()
		<-done
		rep.Results = append(rep.Results, Result{Name: c.name, Status: r.status(), Messages: r.msgs, Duration: time.Since(begin)})
		s.cfg.progress(Progress{Done: &rep.Results[len(rep.Results)-1]})
	}
	s.follow()
	rep.Resource, rep.Endpoint = s.reg.req.GetResourceName(), s.reg.req.GetEndpoint()
	return rep, nil
}

// Test checks a plugin from a Go test: one subtest per group of checks, and
// one below it per check ("registration/version"), so that go test -run
// selects them. It fails t at once when no plugin could be checked.
func Test(t *testing.T, cfg Config) {
	t.Helper()
	s, err := start(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.close)
	t.Logf("checking %s, registered on endpoint %s", s.reg.req.GetResourceName(), s.reg.req.GetEndpoint())
	for i := 0; i < len(checks); {
		group, _, _ := strings.Cut(checks[i].name, "/")
		j := i
		for j < len(checks) && strings.HasPrefix(checks[j].name, group+"/") {
			j++
		}
		t.Run(group, func(t *testing.T) {
			for _, c := range checks[i:j] {
				_, name, _ := strings.Cut(c.name, "/")
				t.Run(name, func(t *testing.T) {
					if s.cfg.Skip != nil && s.cfg.Skip.MatchString(c.name) {
						t.Skip("skipped by the configuration")
					}
					s.follow()
					c.run(s, &C{ctx: t.Context(), t: t})
				})
			}
		})
		i = j
	}
}

// reporter is what a check reports to: a *testing.T under Test, a recorder
// under Run.
type reporter interface {
	Errorf(format string, args ...any)
	FailNow()
	Skipf(format string, args ...any)
}

// recorder keeps a check's messages for Run.
type recorder struct {
	msgs            []string
	failed, skipped bool
}

func (r *recorder) Errorf(format string, args ...any) {
	r.failed = true
	r.msgs = append(r.msgs, fmt.Sprintf(format, args...))
}

func (r *recorder) FailNow() {
	r.failed = true
	runtime.Goexit()
}

func (r *recorder) Skipf(format string, args ...any) {
	r.skipped = true
	r.msgs = append(r.msgs, fmt.Sprintf(format, args...))
	runtime.Goexit()
}

func (r *recorder) status() Status {
	switch {
	case r.failed:
		return Failed
	case r.skipped:
		return Skipped
	}
	return Passed
}

// C is what a check is given: its context and where it reports.
type C struct {
	ctx context.Context
	t   reporter
}

// violatef reports that the plugin broke rule, and goes on.
func (c *C) violatef(rule, format string, args ...any) {
	c.t.Errorf("%s: %s", rule, fmt.Sprintf(format, args...))
}

// fatalf reports that the plugin broke rule, and ends the check.
func (c *C) fatalf(rule, format string, args ...any) {
	c.violatef(rule, format, args...)
	c.t.FailNow()
}

// skipf ends the check without a verdict.
func (c *C) skipf(format string, args ...any) { c.t.Skipf(format, args...) }

// tempSocketDir makes a directory short enough for unix socket paths.
func tempSocketDir() (string, error) {
	return os.MkdirTemp("", "sanity")
}

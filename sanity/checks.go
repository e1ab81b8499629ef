package sanity

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/internal/pluginreg"
)

// check is one named check of the suite.
type check struct {
	name string
	run  func(*suite, *C)
}

// checks run in this order: the list rules after the update, so that they
// cover the lists it brought; the restart last, since it replaces the
// plugin's registration.
var checks = []check{
	{"registration/version", checkVersion},
	{"registration/resource-name", checkResourceName},
	{"registration/endpoint", checkEndpoint},
	{"registration/options", checkOptions},
	{"list-and-watch/first-list", checkFirstList},
	{"list-and-watch/update", checkUpdate},
	{"list-and-watch/device-ids", listRule(0)},
	{"list-and-watch/health", listRule(1)},
	{"list-and-watch/topology", listRule(2)},
	{"preferred-allocation/subset", checkPreferredSubset},
	{"preferred-allocation/must-include", checkPreferredMustInclude},
	{"preferred-allocation/size", checkPreferredSize},
	{"allocate/responses", checkAllocateResponses},
	{"allocate/device-specs", allocateRule(deviceSpecsRule)},
	{"allocate/envs", allocateRule(envsRule)},
	{"allocate/cdi", allocateRule(cdiRule)},
	{"allocate/mounts", allocateRule(mountsRule)},
	{"allocate/unknown-device", checkUnknownDevice},
	{"pre-start/answered", checkPreStart},
	{"concurrency/allocate", checkConcurrentAllocate},
	{"restart/re-register", checkReregister},
}

func checkVersion(s *suite, c *C) {
	if err := pluginreg.CheckVersion(s.reg.req.GetVersion()); err != nil {
		c.violatef("supported API version", "RegisterRequest.Version is %q: %v", s.reg.req.GetVersion(), err)
	}
}

func checkResourceName(s *suite, c *C) {
	if err := pluginreg.CheckResourceName(s.reg.req.GetResourceName()); err != nil {
		c.violatef("extended resource name", "RegisterRequest.ResourceName is %q: a resource must be domain/name, outside kubernetes.io", s.reg.req.GetResourceName())
	}
}

func checkEndpoint(s *suite, c *C) {
	if _, err := pluginreg.EndpointPath(s.cfg.SocketDir, s.reg.req.GetEndpoint()); err != nil {
		c.fatalf("endpoint in the socket directory", "RegisterRequest.Endpoint: %v", err)
	}
	if s.reg.dialErr != nil {
		c.violatef("endpoint serves the device plugin", "RegisterRequest.Endpoint is %q: %v", s.reg.req.GetEndpoint(), s.reg.dialErr)
	}
}

func checkOptions(s *suite, c *C) {
	s.client(c)
	got, sent := s.reg.options, s.reg.req.GetOptions()
	if sent != nil && !proto.Equal(got, sent) {
		c.violatef("registered options agree", "RegisterRequest.Options is %s, GetDevicePluginOptions answers %s", options(sent), options(got))
	}
}

func options(o *pluginapi.DevicePluginOptions) string {
	return fmt.Sprintf("{PreStartRequired: %v, GetPreferredAllocationAvailable: %v}", o.GetPreStartRequired(), o.GetGetPreferredAllocationAvailable())
}

func checkFirstList(s *suite, c *C) {
	s.firstList(c)
	s.healthy(c)
}

// firstList waits up to ListTimeout for a first ListAndWatch message and
// returns every message received, or ends the check.
func (s *suite) firstList(c *C) []*pluginapi.ListAndWatchResponse {
	s.client(c)
	ctx, cancel := context.WithTimeout(c.ctx, s.cfg.ListTimeout)
	defer cancel()
	msgs, err := s.watch.wait(ctx, func(m []*pluginapi.ListAndWatchResponse) bool { return len(m) > 0 })
	switch {
	case errors.Is(err, errTimedOut):
		c.fatalf("first list in time", "no ListAndWatch message within %v", s.cfg.ListTimeout)
	case err != nil:
		c.fatalf("first list in time", "%v, before the first list", err)
	}
	return msgs
}

// listRule checks every list received so far against one of the rules of
// listViolations (0 IDs, 1 health, 2 topology).
func listRule(which int) func(*suite, *C) {
	rules := []string{"unique, non-empty device IDs", "health Healthy or Unhealthy", "topology names NUMA nodes of this machine"}
	return func(s *suite, c *C) {
		for i, m := range s.firstList(c) {
			ids, health, topology := listViolations(i, m, s.cfg.NUMANodes)
			for _, v := range [][]string{ids, health, topology}[which] {
				c.violatef(rules[which], "%s", v)
			}
		}
	}
}

func checkUpdate(s *suite, c *C) {
	if s.cfg.TriggerUpdate == nil {
		c.skipf("the configuration has no TriggerUpdate")
	}
	s.healthy(c)
	before, _ := s.watch.wait(c.ctx, func([]*pluginapi.ListAndWatchResponse) bool { return true })
	if err := s.cfg.TriggerUpdate(c.ctx); err != nil {
		c.fatalf("configuration", "TriggerUpdate: %v", err)
	}
	ctx, cancel := context.WithTimeout(c.ctx, s.cfg.ListTimeout)
	defer cancel()
	_, err := s.watch.wait(ctx, func(m []*pluginapi.ListAndWatchResponse) bool { return len(m) > len(before) })
	switch {
	case errors.Is(err, errTimedOut):
		c.fatalf("new list after a change", "no ListAndWatch message within %v of TriggerUpdate", s.cfg.ListTimeout)
	case err != nil:
		c.fatalf("new list after a change", "%v, after TriggerUpdate", err)
	}
}

// preferred asks for a preferred allocation of two of the healthy devices
// (one if there is only one, or if Config.MaxDevicesPerContainer is 1), the
// first of them required, and returns the
// request and the IDs answered; it ends the check if the plugin does not
// advertise the call or does not answer it with one container response.
func preferred(s *suite, c *C) (*pluginapi.ContainerPreferredAllocationRequest, []string) {
	client := s.client(c)
	if !s.reg.options.GetGetPreferredAllocationAvailable() {
		c.skipf("the plugin does not advertise GetPreferredAllocationAvailable")
	}
	ids := s.healthy(c)
	req := &pluginapi.ContainerPreferredAllocationRequest{
		AvailableDeviceIDs:   ids,
		MustIncludeDeviceIDs: ids[:1],
		AllocationSize:       int32(min(2, len(ids), s.cfg.MaxDevicesPerContainer)),
	}
	ctx, cancel := context.WithTimeout(c.ctx, s.cfg.CallTimeout)
	defer cancel()
	resp, err := client.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{
		ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{req},
	})
	if err != nil {
		c.fatalf("answers GetPreferredAllocation", "%v", err)
	}
	if n := len(resp.GetContainerResponses()); n != 1 {
		c.fatalf("one response per container request", "1 container request, %d responses", n)
	}
	return req, resp.GetContainerResponses()[0].GetDeviceIDs()
}

func checkPreferredSubset(s *suite, c *C) {
	req, got := preferred(s, c)
	seen := map[string]bool{}
	for _, id := range got {
		if !slices.Contains(req.AvailableDeviceIDs, id) || seen[id] {
			c.violatef("a subset of the available devices", "preferred %q from available %q", got, req.AvailableDeviceIDs)
			return
		}
		seen[id] = true
	}
}

func checkPreferredMustInclude(s *suite, c *C) {
	req, got := preferred(s, c)
	for _, id := range req.MustIncludeDeviceIDs {
		if !slices.Contains(got, id) {
			c.violatef("every must-include device", "preferred %q without must-include %q", got, id)
		}
	}
}

func checkPreferredSize(s *suite, c *C) {
	req, got := preferred(s, c)
	if len(got) != int(req.AllocationSize) {
		c.violatef("the requested size", "preferred %d devices %q for allocation size %d", len(got), got, req.AllocationSize)
	}
}

// allocate calls Allocate with one container request per ID list; it ends
// the check when the call fails.
func allocate(s *suite, c *C, containers ...[]string) *pluginapi.AllocateResponse {
	req := &pluginapi.AllocateRequest{}
	for _, ids := range containers {
		req.ContainerRequests = append(req.ContainerRequests, &pluginapi.ContainerAllocateRequest{DevicesIds: ids})
	}
	ctx, cancel := context.WithTimeout(c.ctx, s.cfg.CallTimeout)
	defer cancel()
	resp, err := s.client(c).Allocate(ctx, req)
	if err != nil {
		c.fatalf("answers Allocate", "Allocate of listed healthy devices %q: %v", containers, err)
	}
	return resp
}

func checkAllocateResponses(s *suite, c *C) {
	ids := s.healthy(c)
	containers := [][]string{ids[:1]}
	if len(ids) > 1 { // never one device in two containers: the kubelet does not
		containers = append(containers, ids[1:2])
	}
	resp := allocate(s, c, containers...)
	if n := len(resp.GetContainerResponses()); n != len(containers) {
		c.violatef("one response per container request", "%d container requests, %d responses", len(containers), n)
	}
}

// allocateRule allocates one healthy device (any plugin takes one per
// container) and checks the response against one rule.
func allocateRule(r responseRule) func(*suite, *C) {
	return func(s *suite, c *C) {
		ids := s.healthy(c)
		resp := allocate(s, c, ids[:1])
		for _, car := range resp.GetContainerResponses() {
			for _, v := range r.check(car) {
				c.violatef(r.name, "%s", v)
			}
		}
	}
}

func checkUnknownDevice(s *suite, c *C) {
	ids := s.healthy(c)
	unknown := "sanity-unknown-device"
	for slices.Contains(ids, unknown) {
		unknown += "-x"
	}
	ctx, cancel := context.WithTimeout(c.ctx, s.cfg.CallTimeout)
	defer cancel()
	resp, err := s.client(c).Allocate(ctx, &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{unknown}}},
	})
	if err == nil {
		c.violatef("unknown device refused", "Allocate of %q, a device the plugin never listed, answered %d container responses and no error",
			unknown, len(resp.GetContainerResponses()))
	}
}

func checkPreStart(s *suite, c *C) {
	client := s.client(c)
	if !s.reg.options.GetPreStartRequired() {
		c.skipf("the plugin does not advertise PreStartRequired")
	}
	ids := s.healthy(c)
	ctx, cancel := context.WithTimeout(c.ctx, s.cfg.PreStartTimeout)
	defer cancel()
	if _, err := client.PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{DevicesIds: ids[:1]}); err != nil {
		c.violatef("answers PreStartContainer", "PreStartContainer of %q: %v", ids[:1], err)
	}
}

func checkConcurrentAllocate(s *suite, c *C) {
	ids := s.healthy(c)
	client := s.client(c)
	problems := make([][]string, s.cfg.Parallel)
	// One deadline for all: a plugin may answer one call at a time.
	ctx, cancel := context.WithTimeout(c.ctx, s.cfg.CallTimeout*time.Duration(s.cfg.Parallel))
	defer cancel()
	var wg sync.WaitGroup
	for i := range s.cfg.Parallel {
		wg.Go(func() {
			id := ids[i%len(ids)]
			resp, err := client.Allocate(ctx, &pluginapi.AllocateRequest{
				ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{id}}},
			})
			switch {
			case err != nil:
				problems[i] = append(problems[i], fmt.Sprintf("call %d (%q): %v", i+1, id, err))
			case len(resp.GetContainerResponses()) != 1:
				problems[i] = append(problems[i], fmt.Sprintf("call %d (%q): %d responses for 1 container request", i+1, id, len(resp.GetContainerResponses())))
			default:
				for _, r := range responseRules {
					for _, v := range r.check(resp.GetContainerResponses()[0]) {
						problems[i] = append(problems[i], fmt.Sprintf("call %d (%q): %s: %s", i+1, id, r.name, v))
					}
				}
			}
		})
	}
	wg.Wait()
	for _, p := range slices.Concat(problems...) {
		c.violatef(fmt.Sprintf("%d concurrent Allocate calls answered", s.cfg.Parallel), "%s", p)
	}
}

// checkReregister restarts the suite's kubelet as a node's kubelet restarts
// (kubelet.sock and every other socket in the directory removed, kubelet.sock
// served again) and expects the plugin to register again with the same
// devices.
func checkReregister(s *suite, c *C) {
	before := s.healthy(c)
	name := s.reg.req.GetResourceName()
	s.k.stop()
	s.watch.stop()
	s.k.disconnect() // the plugin's streams end, as when a kubelet exits
	n, _ := s.k.received()
	if err := s.k.start(); err != nil {
		c.fatalf("kubelet restart", "the suite could not serve kubelet.sock again: %v", err)
	}
	ctx, cancel := context.WithTimeout(c.ctx, s.cfg.ReregisterTimeout)
	defer cancel()
	r, err := s.k.wait(ctx, n, func(r *registration) bool { return r.req.GetResourceName() == name })
	if err != nil {
		c.fatalf("registers again after the kubelet restarts", "no registration of %s within %v of kubelet.sock being re-created", name, s.cfg.ReregisterTimeout)
	}
	if r.conn == nil {
		c.fatalf("registers again after the kubelet restarts", "the new registration failed: %v", r.err)
	}
	s.reg, s.watch = r, newWatch(r)
	after := s.healthy(c)
	if !slices.Equal(before, after) {
		c.violatef("same devices after the restart", "healthy devices before %s, after %s", strings.Join(before, ","), strings.Join(after, ","))
	}
}

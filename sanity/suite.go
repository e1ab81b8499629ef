package sanity

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/podinfo"
)

// suite is a plugin under check: the kubelet it registered with, its
// registration, and the device lists it has sent.
type suite struct {
	cfg    Config
	k      *kubelet
	ownDir bool
	reg    *registration
	watch  *watch
	// deviceless is the watch on which a check waited ListTimeout for a
	// device in vain; later checks on it do not wait again.
	deviceless *watch
}

// start serves kubelet.sock, starts the plugin if the configuration says
// how, and waits for its registration.
func start(ctx context.Context, cfg Config) (*suite, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &suite{cfg: cfg}
	if cfg.SocketDir == "" {
		if s.cfg.SocketDir, err = tempSocketDir(); err != nil {
			return nil, err
		}
		s.ownDir = true
	} else if err := os.MkdirAll(cfg.SocketDir, 0o750); err != nil {
		return nil, err
	}
	s.k = newKubelet(s.cfg.SocketDir, cfg.CallTimeout)
	if err := s.k.start(); err != nil {
		s.close()
		return nil, err
	}
	if cfg.StartPlugin != nil {
		if err := cfg.StartPlugin(s.cfg.SocketDir); err != nil {
			s.close()
			return nil, fmt.Errorf("sanity: start the plugin: %w", err)
		}
	}
	cfg.progress(Progress{Waiting: filepath.Join(s.cfg.SocketDir, "kubelet.sock")})
	wctx, cancel := context.WithTimeout(ctx, cfg.RegisterTimeout)
	defer cancel()
	s.reg, err = s.k.wait(wctx, 0, func(r *registration) bool {
		return cfg.ResourceName == "" || r.req.GetResourceName() == cfg.ResourceName
	})
	if err != nil && ctx.Err() != nil {
		s.close()
		return nil, fmt.Errorf("sanity: stopped while waiting for a registration: %w", context.Cause(ctx))
	}
	if err != nil {
		n, names := s.k.received()
		s.close()
		what := "a device plugin"
		if cfg.ResourceName != "" {
			what = "a device plugin for " + cfg.ResourceName
		}
		msg := fmt.Sprintf("sanity: %s did not register in %s within %v", what, s.cfg.SocketDir, cfg.RegisterTimeout)
		if n > 0 {
			msg += fmt.Sprintf("; registered: %q", names)
		}
		return nil, notRegisteredError(msg)
	}
	if s.reg.conn != nil {
		s.watch = newWatch(s.reg)
	}
	cfg.progress(Progress{Registered: s.reg.req.GetResourceName()})
	return s, nil
}

// ErrNotRegistered matches, with errors.Is, the error of Run and Test when
// no plugin, or none for Config.ResourceName, registered within
// RegisterTimeout.
var ErrNotRegistered = errors.New("sanity: the device plugin did not register")

// notRegisteredError is ErrNotRegistered with what was waited for and what
// registered instead.
type notRegisteredError string

func (e notRegisteredError) Error() string      { return string(e) }
func (notRegisteredError) Is(target error) bool { return target == ErrNotRegistered }

func (s *suite) close() {
	if s.watch != nil {
		s.watch.stop()
	}
	if s.k != nil {
		s.k.close()
	}
	if s.ownDir {
		_ = os.RemoveAll(s.cfg.SocketDir)
	}
}

// follow makes the newest registration of the checked resource the one the
// checks use, as the kubelet follows a plugin that registers again.
func (s *suite) follow() {
	name := s.reg.req.GetResourceName()
	r := s.k.latest(func(r *registration) bool { return r.req.GetResourceName() == name })
	if r == nil || r == s.reg {
		return
	}
	if s.watch != nil {
		s.watch.stop()
		s.watch = nil
	}
	s.reg = r
	if r.conn != nil {
		s.watch = newWatch(r)
	}
}

// client returns the plugin's client, or ends the check when the suite
// could not reach the plugin.
func (s *suite) client(c *C) pluginapi.DevicePluginClient {
	if s.reg.conn == nil {
		c.fatalf("reachable endpoint", "the plugin could not be reached at its endpoint %q: %v", s.reg.req.GetEndpoint(), s.reg.err)
	}
	client := pluginapi.NewDevicePluginClient(s.reg.conn)
	if s.cfg.PodInfo == nil {
		return client
	}
	return podInfoClient{client, *s.cfg.PodInfo}
}

// podInfoClient names Config.PodInfo in the metadata of the calls that a
// device manager with Options.SendPodInfo names a pod in.
type podInfoClient struct {
	pluginapi.DevicePluginClient
	info podinfo.Info
}

func (p podInfoClient) Allocate(ctx context.Context, in *pluginapi.AllocateRequest, opts ...grpc.CallOption) (*pluginapi.AllocateResponse, error) {
	return p.DevicePluginClient.Allocate(podinfo.NewOutgoingContext(ctx, p.info), in, opts...)
}

func (p podInfoClient) GetPreferredAllocation(ctx context.Context, in *pluginapi.PreferredAllocationRequest,
	opts ...grpc.CallOption) (*pluginapi.PreferredAllocationResponse, error) {
	return p.DevicePluginClient.GetPreferredAllocation(podinfo.NewOutgoingContext(ctx, p.info), in, opts...)
}

func (p podInfoClient) PreStartContainer(ctx context.Context, in *pluginapi.PreStartContainerRequest,
	opts ...grpc.CallOption) (*pluginapi.PreStartContainerResponse, error) {
	return p.DevicePluginClient.PreStartContainer(podinfo.NewOutgoingContext(ctx, p.info), in, opts...)
}

// healthy returns the healthy device IDs of the latest list that has any
// device, waiting up to ListTimeout for one, or ends the check.
func (s *suite) healthy(c *C) []string {
	s.client(c)
	wait := s.cfg.ListTimeout
	if s.deviceless == s.watch {
		wait = 0 // an earlier check waited already
	}
	ctx, cancel := context.WithTimeout(c.ctx, wait)
	defer cancel()
	msgs, err := s.watch.wait(ctx, func(msgs []*pluginapi.ListAndWatchResponse) bool {
		return slices.ContainsFunc(msgs, func(m *pluginapi.ListAndWatchResponse) bool { return len(m.Devices) > 0 })
	})
	switch {
	case errors.Is(err, errTimedOut):
		s.deviceless = s.watch
		c.fatalf("lists a device", "no list with a device within %v (%d lists received): the allocation checks need one", s.cfg.ListTimeout, len(msgs))
	case err != nil:
		c.fatalf("lists a device", "%v, before any list with a device (%d lists received)", err, len(msgs))
	}
	for _, m := range slices.Backward(msgs) {
		if len(m.Devices) == 0 {
			continue
		}
		var ids, sent []string
		for _, d := range m.Devices {
			if d.Health == pluginapi.Healthy {
				ids = append(ids, d.ID)
			}
			sent = append(sent, fmt.Sprintf("%s %q", d.ID, d.Health))
		}
		if len(ids) == 0 {
			c.fatalf("lists a healthy device", "the latest list has %d devices, none %q: %s", len(m.Devices), pluginapi.Healthy, strings.Join(sent[:min(5, len(sent))], ", "))
		}
		slices.Sort(ids)
		return slices.Compact(ids)
	}
	panic("unreachable")
}

// maxLists bounds the lists a watch keeps: a plugin that sends more in one
// run floods its stream, and the suite stops reading it.
const maxLists = 1000

// watch is a ListAndWatch stream and every message it brought, up to
// maxLists.
type watch struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	msgs    []*pluginapi.ListAndWatchResponse
	err     error         // why the stream ended
	changed chan struct{} // closed and replaced on each message and at the end
}

func newWatch(r *registration) *watch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &watch{cancel: cancel, done: make(chan struct{}), changed: make(chan struct{})}
	go func() {
		defer close(w.done)
		stream, err := pluginapi.NewDevicePluginClient(r.conn).ListAndWatch(ctx, &pluginapi.Empty{})
		for n := 0; err == nil; n++ {
			var m *pluginapi.ListAndWatchResponse
			switch m, err = stream.Recv(); {
			case err != nil:
			case n == maxLists:
				err = fmt.Errorf("the plugin sent more than %d lists: the suite stopped reading", maxLists)
			default:
				w.add(m, nil)
			}
		}
		w.add(nil, err)
	}()
	return w
}

func (w *watch) add(m *pluginapi.ListAndWatchResponse, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if m != nil {
		w.msgs = append(w.msgs, m)
	} else {
		w.err = err
	}
	close(w.changed)
	w.changed = make(chan struct{})
}

// errTimedOut is the error of a wait whose context ended.
var errTimedOut = errors.New("timed out")

// wait returns the messages so far once done says they are enough, or with
// an error when ctx ends (errTimedOut) or the stream does first.
func (w *watch) wait(ctx context.Context, done func([]*pluginapi.ListAndWatchResponse) bool) ([]*pluginapi.ListAndWatchResponse, error) {
	for {
		w.mu.Lock()
		msgs, err, changed := w.msgs, w.err, w.changed
		w.mu.Unlock()
		if done(msgs) {
			return msgs, nil
		}
		if err != nil {
			return msgs, fmt.Errorf("the ListAndWatch stream ended: %w", err)
		}
		select {
		case <-ctx.Done():
			return msgs, errTimedOut
		case <-changed:
		}
	}
}

func (w *watch) stop() {
	w.cancel()
	<-w.done
}

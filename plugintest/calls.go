package plugintest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/openkubelet/devmgr/podinfo"
)

// Method names an RPC the Plugin serves: the five DevicePlugin methods and
// the two pluginregistration Registration methods.
type Method string

// The RPCs a Plugin serves.
const (
	MethodGetDevicePluginOptions   Method = "GetDevicePluginOptions"
	MethodListAndWatch             Method = "ListAndWatch"
	MethodGetPreferredAllocation   Method = "GetPreferredAllocation"
	MethodAllocate                 Method = "Allocate"
	MethodPreStartContainer        Method = "PreStartContainer"
	MethodGetInfo                  Method = "GetInfo"
	MethodNotifyRegistrationStatus Method = "NotifyRegistrationStatus"
)

// Call is one recorded RPC.
type Call struct {
	// Method is the RPC called.
	Method Method
	// Request is a copy of the request message, for example an
	// *pluginapi.AllocateRequest; ListAndWatch records a *pluginapi.Empty.
	Request proto.Message
	// Time is when the call arrived.
	Time time.Time
	// Deadline is the caller's deadline; zero when the call had none.
	Deadline time.Time
	// Metadata is a copy of the gRPC metadata the call carried.
	Metadata metadata.MD
}

// PodInfo returns the pod and container the caller named in the call's
// metadata (a device manager with Options.SendPodInfo does); ok is false
// when it named none.
func (c Call) PodInfo() (info podinfo.Info, ok bool) { return podinfo.FromMetadata(c.Metadata) }

// fault is the failure injected into one method. Guarded by Plugin.mu.
type fault struct {
	err    error
	delay  time.Duration
	blocks []*block
}

// block is one Block; calls wait until released is closed.
type block struct {
	released chan struct{}
	once     sync.Once
}

// Calls returns every recorded call, oldest first. The result is a copy the
// caller may modify.
func (p *Plugin) Calls() []Call {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.callsOfLocked("")
}

// CallsOf returns the recorded calls of method m, oldest first.
func (p *Plugin) CallsOf(m Method) []Call {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.callsOfLocked(m)
}

// ResetCalls forgets every recorded call.
func (p *Plugin) ResetCalls() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = nil
}

// WaitForCalls returns the recorded calls of m once there are at least n of
// them, or ctx's error, wrapped, with the calls seen so far. A call is
// recorded when it arrives, before any injected block, delay or error, so
// WaitForCalls also tells that a blocked call is in flight.
func (p *Plugin) WaitForCalls(ctx context.Context, m Method, n int) ([]Call, error) {
	for {
		p.mu.Lock()
		calls, changed := p.callsOfLocked(m), p.changed
		p.mu.Unlock()
		if len(calls) >= n {
			return calls, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return calls, fmt.Errorf("plugintest: waiting for %d %s calls, have %d: %w", n, m, len(calls), ctx.Err())
		}
	}
}

// WaitForStreams returns once exactly n ListAndWatch streams are open, or
// ctx's error, wrapped. A stream counts from the moment its first message is
// queued, so an Update made after WaitForStreams returns reaches it after
// that message; it stops counting when it ends. WaitForStreams(ctx, 0) waits
// for every stream to end.
func (p *Plugin) WaitForStreams(ctx context.Context, n int) error {
	for {
		p.mu.Lock()
		open, changed := len(p.watchers), p.changed
		p.mu.Unlock()
		if open == n {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("plugintest: waiting for %d ListAndWatch streams, have %d: %w", n, open, ctx.Err())
		}
	}
}

// SetError makes every later call of m fail with err (after any block and
// delay); nil clears it. A status error (google.golang.org/grpc/status)
// reaches the client with its code, any other error as codes.Unknown. For
// ListAndWatch the stream fails before its first message.
func (p *Plugin) SetError(m Method, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faultLocked(m).err = err
}

// SetDelay makes every later call of m wait d before it is served; 0 clears
// it. The wait ends early, with the context's status, when the caller's
// deadline passes or it cancels.
func (p *Plugin) SetDelay(m Method, d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faultLocked(m).delay = d
}

// Block makes calls of m that arrive from now on hang until release is
// called, the caller's context ends (the call then fails with that
// context's status) or the Plugin stops. release is idempotent. With several
// Blocks on m, a call waits for all those in place when it arrived.
func (p *Plugin) Block(m Method) (release func()) {
	b := &block{released: make(chan struct{})}
	p.mu.Lock()
	f := p.faultLocked(m)
	f.blocks = append(f.blocks, b)
	p.mu.Unlock()
	return func() {
		b.once.Do(func() {
			p.mu.Lock()
			f := p.faultLocked(m)
			f.blocks = slices.DeleteFunc(f.blocks, func(x *block) bool { return x == b })
			p.mu.Unlock()
			close(b.released)
		})
	}
}

// enter runs the common prologue of every RPC: record the call, then wait
// for blocks and the delay, then return the injected error. Each step reads
// the configuration in force when it starts, so SetError made while a call
// is blocked applies to that call.
func (p *Plugin) enter(ctx context.Context, m Method, req proto.Message) error {
	deadline, _ := ctx.Deadline()
	md, _ := metadata.FromIncomingContext(ctx)
	p.mu.Lock()
	p.calls = append(p.calls, Call{Method: m, Request: proto.Clone(req), Time: time.Now(), Deadline: deadline, Metadata: md.Copy()})
	p.broadcastLocked()
	blocks := slices.Clone(p.faultLocked(m).blocks)
	p.mu.Unlock()
	p.logger.V(4).Info("RPC called", "method", m)

	for _, b := range blocks {
		select {
		case <-b.released:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-p.done:
			return errStoppedStatus()
		}
	}

	p.mu.Lock()
	delay := p.faultLocked(m).delay
	p.mu.Unlock()
	if delay > 0 {
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-p.done:
			return errStoppedStatus()
		}
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	return p.faultLocked(m).err
}

func (p *Plugin) faultLocked(m Method) *fault {
	f, ok := p.faults[m]
	if !ok {
		f = &fault{}
		p.faults[m] = f
	}
	return f
}

// callsOfLocked copies the calls of m; "" selects every call.
func (p *Plugin) callsOfLocked(m Method) []Call {
	out := make([]Call, 0, len(p.calls))
	for _, c := range p.calls {
		if m == "" || c.Method == m {
			c.Request = proto.Clone(c.Request)
			out = append(out, c)
		}
	}
	return out
}

func errStoppedStatus() error {
	return status.Error(codes.Unavailable, ErrStopped.Error())
}

package plugintest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// allocResult is the outcome of an Allocate made in another goroutine.
type allocResult struct {
	resp *pluginapi.AllocateResponse
	err  error
}

// allocateAsync calls Allocate for device "a" in a goroutine the test waits
// for before it ends.
func allocateAsync(t *testing.T, ctx context.Context, client pluginapi.DevicePluginClient) <-chan allocResult {
	t.Helper()
	ch := make(chan allocResult, 1)
	done := make(chan struct{})
	t.Cleanup(func() { <-done })
	go func() {
		defer close(done)
		resp, err := client.Allocate(ctx, allocReq("a"))
		ch <- allocResult{resp, err}
	}()
	return ch
}

func allocReq(ids ...string) *pluginapi.AllocateRequest {
	return &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}}
}

// requireNoResult fails if the call already returned. Used while the call is
// blocked, when it cannot have returned if Block works.
func requireNoResult(t *testing.T, ch <-chan allocResult) {
	t.Helper()
	select {
	case r := <-ch:
		require.Failf(t, "call returned while blocked", "resp %v, err %v", r.resp, r.err)
	default:
	}
}

func receive(t *testing.T, ctx context.Context, ch <-chan allocResult) allocResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-ctx.Done():
		require.FailNow(t, "call did not return")
		return allocResult{}
	}
}

func TestCallsAreRecorded(t *testing.T) {
	p, client := startPlugin(t, Options{Devices: devices("a", "b")})
	ctx := testContext(t)
	before := time.Now()

	noDeadline, cancelNoDeadline := context.WithCancel(context.Background())
	defer cancelNoDeadline()
	_, err := client.GetDevicePluginOptions(noDeadline, &pluginapi.Empty{})
	require.NoError(t, err)
	req := allocReq("b", "a")
	callCtx, cancel := context.WithTimeout(ctx, time.Hour)
	defer cancel()
	_, err = client.Allocate(callCtx, req)
	require.NoError(t, err)
	req.ContainerRequests[0].DevicesIds[0] = "changed after the call"

	calls := p.Calls()
	require.Len(t, calls, 2)
	assert.Equal(t, MethodGetDevicePluginOptions, calls[0].Method)
	requireProtoEqual(t, &pluginapi.Empty{}, calls[0].Request)
	assert.Equal(t, MethodAllocate, calls[1].Method)
	requireProtoEqual(t, allocReq("b", "a"), calls[1].Request)
	assert.False(t, calls[1].Time.Before(before))
	assert.False(t, calls[1].Deadline.IsZero(), "the caller's deadline is recorded")
	assert.True(t, calls[0].Deadline.IsZero(), "no deadline recorded when the caller set none")

	// The result is a copy.
	calls[1].Request.(*pluginapi.AllocateRequest).ContainerRequests = nil
	requireProtoEqual(t, allocReq("b", "a"), p.CallsOf(MethodAllocate)[0].Request)
	assert.Empty(t, p.CallsOf(MethodPreStartContainer))

	p.ResetCalls()
	assert.Empty(t, p.Calls())
}

func TestWaitForCalls(t *testing.T) {
	p, client := startPlugin(t, Options{Devices: devices("a", "b")})
	ctx := testContext(t)

	short, cancel := context.WithCancel(ctx)
	cancel()
	calls, err := p.WaitForCalls(short, MethodAllocate, 1)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorContains(t, err, "waiting for 1 Allocate calls, have 0")
	assert.Empty(t, calls)

	results := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := client.Allocate(ctx, allocReq("a"))
			results <- err
		}()
	}
	calls, err = p.WaitForCalls(ctx, MethodAllocate, 2)
	require.NoError(t, err)
	assert.Len(t, calls, 2)
	for range 2 {
		require.NoError(t, <-results)
	}
}

func TestWaitForStreamsTimesOut(t *testing.T) {
	p, _ := startPlugin(t, Options{})
	ctx, cancel := context.WithCancel(testContext(t))
	cancel()
	err := p.WaitForStreams(ctx, 1)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorContains(t, err, "waiting for 1 ListAndWatch streams, have 0")
}

func TestSetError(t *testing.T) {
	p, client := startPlugin(t, Options{Devices: devices("a")})
	ctx := testContext(t)

	p.SetError(MethodAllocate, status.Error(codes.Internal, "broken"))
	_, err := client.Allocate(ctx, allocReq("a"))
	assert.Equal(t, codes.Internal, status.Code(err))
	assert.Len(t, p.CallsOf(MethodAllocate), 1, "a failed call is recorded")

	p.SetError(MethodGetDevicePluginOptions, errors.New("plain"))
	_, err = client.GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	assert.Equal(t, codes.Unknown, status.Code(err))

	p.SetError(MethodListAndWatch, status.Error(codes.Unavailable, "no stream"))
	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	require.NoError(t, err)
	_, err = stream.Recv()
	assert.Equal(t, codes.Unavailable, status.Code(err))

	p.SetError(MethodAllocate, nil)
	_, err = client.Allocate(ctx, allocReq("a"))
	require.NoError(t, err)
	_, err = client.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{})
	require.NoError(t, err, "errors are per method")
}

func TestSetDelay(t *testing.T) {
	p, client := startPlugin(t, Options{Devices: devices("a", "b")})
	ctx := testContext(t)

	p.SetDelay(MethodAllocate, time.Hour)
	callCtx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err := client.Allocate(callCtx, allocReq("a"))
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err))
	// Stop (in cleanup) waits for the handler: it returns only because the
	// delay ends with the caller's context.

	p.SetDelay(MethodAllocate, time.Millisecond)
	_, err = client.Allocate(ctx, allocReq("a"))
	require.NoError(t, err)

	p.SetDelay(MethodAllocate, 0)
	_, err = client.Allocate(ctx, allocReq("a"))
	require.NoError(t, err)
}

func TestBlockUntilCallerDeadline(t *testing.T) {
	p, client := startPlugin(t, Options{Devices: devices("a", "b")})
	ctx := testContext(t)
	release := p.Block(MethodAllocate)
	defer release()
	// The connection is opened by a first call, so that the blocked call's
	// deadline is spent in the plugin, not on the dial.
	_, err := client.GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	require.NoError(t, err)

	callCtx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err = client.Allocate(callCtx, allocReq("a"))
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err))
	require.Len(t, p.CallsOf(MethodAllocate), 1)

	_, err = client.GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	require.NoError(t, err, "other methods are not blocked")
}

func TestBlockUntilReleased(t *testing.T) {
	p, client := startPlugin(t, Options{Devices: devices("a", "b")})
	ctx := testContext(t)
	release := p.Block(MethodAllocate)

	result := allocateAsync(t, ctx, client)
	_, err := p.WaitForCalls(ctx, MethodAllocate, 1)
	require.NoError(t, err)
	requireNoResult(t, result)

	// Configuration changed while blocked applies when the call proceeds.
	p.SetError(MethodAllocate, status.Error(codes.Aborted, "late"))
	release()
	release() // idempotent
	r := receive(t, ctx, result)
	assert.Equal(t, codes.Aborted, status.Code(r.err))

	p.SetError(MethodAllocate, nil)
	_, err = client.Allocate(ctx, allocReq("a"))
	require.NoError(t, err, "calls after release are not blocked")
}

func TestSeveralBlocks(t *testing.T) {
	p, client := startPlugin(t, Options{Devices: devices("a", "b")})
	ctx := testContext(t)
	release1 := p.Block(MethodAllocate)
	release2 := p.Block(MethodAllocate)

	result := allocateAsync(t, ctx, client)
	_, err := p.WaitForCalls(ctx, MethodAllocate, 1)
	require.NoError(t, err)
	release1()
	requireNoResult(t, result)
	// The call is still waiting for the second Block: a second Allocate
	// arriving now is blocked too.
	second := allocateAsync(t, ctx, client)
	_, err = p.WaitForCalls(ctx, MethodAllocate, 2)
	require.NoError(t, err)
	requireNoResult(t, second)

	release2()
	for _, ch := range []<-chan allocResult{result, second} {
		r := receive(t, ctx, ch)
		require.NoError(t, r.err)
		requireProtoEqual(t, p.DefaultAllocate(allocReq("a")), r.resp)
	}
}

func TestStopReleasesBlockedCalls(t *testing.T) {
	p, client := startPlugin(t, Options{Devices: devices("a", "b")})
	ctx := testContext(t)
	release := p.Block(MethodAllocate)
	defer release()

	result := allocateAsync(t, ctx, client)
	_, err := p.WaitForCalls(ctx, MethodAllocate, 1)
	require.NoError(t, err)

	p.Stop()
	r := receive(t, ctx, result)
	assert.Equal(t, codes.Unavailable, status.Code(r.err))
}

func TestStopEndsDelayedCalls(t *testing.T) {
	p, client := startPlugin(t, Options{Devices: devices("a", "b")})
	ctx := testContext(t)
	p.SetDelay(MethodAllocate, time.Hour)

	result := allocateAsync(t, ctx, client)
	_, err := p.WaitForCalls(ctx, MethodAllocate, 1)
	require.NoError(t, err)

	p.Stop()
	r := receive(t, ctx, result)
	assert.Equal(t, codes.Unavailable, status.Code(r.err))
}

func TestBlockListAndWatch(t *testing.T) {
	p, client := startPlugin(t, Options{Devices: devices("a")})
	ctx := testContext(t)
	release := p.Block(MethodListAndWatch)

	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	require.NoError(t, err)
	_, err = p.WaitForCalls(ctx, MethodListAndWatch, 1)
	require.NoError(t, err)
	assert.Equal(t, 0, p.Streams(), "a blocked stream has not started")
	p.Update(devices("b"))
	release()
	assert.Equal(t, []string{"b"}, recvIDs(t, stream), "the stream starts with the list current when it is released")
}

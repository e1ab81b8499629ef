package devicemanager

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/endpoint"
)

// grpcServerMinTime is the interval between pings a gRPC server's default
// enforcement policy demands (grpc-go's keepalive.EnforcementPolicy
// MinTime when left zero).
const grpcServerMinTime = 5 * time.Minute

// shortKeepalive is the shortest keepalive time gRPC clients accept: tests
// use it so that pings come every few seconds.
const shortKeepalive = 10 * time.Second

// The defaults leave a healthy plugin's server a margin as large as its own
// limit: pings at least twice the server's minimum apart.
func TestKeepaliveDefaults(t *testing.T) {
	const margin = grpcServerMinTime
	assert.GreaterOrEqual(t, endpoint.DefaultKeepaliveTime, grpcServerMinTime+margin)
	m, err := NewManagerImpl(Options{SocketDir: "/nonexistent"})
	require.NoError(t, err)
	assert.Equal(t, endpoint.DefaultKeepaliveTime, m.opts.KeepaliveTime)
	assert.Equal(t, endpoint.DefaultKeepaliveTimeout, m.opts.KeepaliveTimeout)
}

// A plugin whose connection stops carrying bytes while both ends stay open
// is found by the keepalive and disconnected within Time+Timeout: its
// devices go unhealthy, as when a plugin goes away.
func TestKeepaliveFindsWedgedPlugin(t *testing.T) {
	t.Parallel()
	const timeout = time.Second
	h := newHarness(t, func(o *Options) {
		o.KeepaliveTime, o.KeepaliveTimeout = shortKeepalive, timeout
	}).start()
	p := h.plugin(res1, devices("d", 3))
	proxy := newFrameProxy(t, filepath.Join(h.dir, "proxy.sock"), p.SocketPath())
	req := p.RegisterRequest()
	req.Endpoint = "proxy.sock"
	require.NoError(t, p.RegisterWith(context.Background(), h.kubeletSocket(), req))
	h.waitCapacity(res1, 3, 3)

	proxy.wedge()
	require.Eventually(t, func() bool {
		c, a := h.capacity(res1)
		return c == 3 && a == 0
	}, shortKeepalive+timeout+10*time.Second, 10*time.Millisecond, "the wedged plugin is disconnected")
	assert.Equal(t, 1, p.Streams(), "the plugin itself never saw its stream end")
}

// A plugin server whose enforcement policy relates to the client's ping
// interval as a default server's does to the default interval keeps its
// connection over several pings.
func TestKeepaliveKeepsDefaultServer(t *testing.T) {
	t.Parallel()
	// The same multiple of the client's time as in the defaults.
	minTime := time.Duration(float64(shortKeepalive) * float64(grpcServerMinTime) / float64(endpoint.DefaultKeepaliveTime))
	h, proxy := keepaliveRig(t, minTime)

	// A server closes the connection at its third strike, which pings too
	// frequent reach by the fourth keepalive ping (by the third when a
	// flow-control ping came first, as in the test below): a fifth on the
	// same connection shows that every one was accepted.
	require.Eventually(t, func() bool { return proxy.state().pings >= 5 },
		8*shortKeepalive, 10*time.Millisecond, "five pings")
	st := proxy.state()
	assert.Equal(t, 1, st.conns, "one connection throughout")
	assert.Empty(t, st.goaways)
	c, a := h.capacity(res1)
	assert.Equal(t, [2]int64{2, 2}, [2]int64{c, a}, "the resource stays healthy")
}

// The converse, which shows the test above can fail: a server demanding
// more time between pings than the client leaves answers GOAWAY
// too_many_pings, and the plugin is disconnected.
func TestKeepaliveTooOftenCostsConnection(t *testing.T) {
	t.Parallel()
	h, proxy := keepaliveRig(t, 2*shortKeepalive)
	require.Eventually(t, func() bool {
		c, a := h.capacity(res1)
		return c == 2 && a == 0
	}, 8*shortKeepalive, 10*time.Millisecond, "the plugin is disconnected")
	assert.Contains(t, proxy.state().goaways, "too_many_pings")
}

// keepaliveRig runs a manager that pings every shortKeepalive and a plain
// gRPC device plugin whose enforcement policy demands minTime between
// pings, connected through a frame proxy, and waits until the plugin's two
// devices are healthy.
func keepaliveRig(t *testing.T, minTime time.Duration) (*harness, *frameProxy) {
	h := newHarness(t, func(o *Options) {
		o.KeepaliveTime, o.KeepaliveTimeout = shortKeepalive, 5*time.Second
	}).start()
	lis, err := net.Listen("unix", filepath.Join(h.dir, "plain.sock"))
	require.NoError(t, err)
	srv := grpc.NewServer(grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: minTime}))
	pluginapi.RegisterDevicePluginServer(srv, plainPlugin{devs: devices("d", 2)})
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-served
	})
	proxy := newFrameProxy(t, filepath.Join(h.dir, "proxy.sock"), lis.Addr().String())

	conn, err := grpc.NewClient("unix://"+h.kubeletSocket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	_, err = pluginapi.NewRegistrationClient(conn).Register(context.Background(), &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: "proxy.sock", ResourceName: res1,
	})
	require.NoError(t, err)
	h.waitCapacity(res1, 2, 2)
	return h, proxy
}

// plainPlugin is a device plugin on a gRPC server configured by the test:
// ListAndWatch sends devs once and then nothing until the stream ends.
type plainPlugin struct {
	pluginapi.UnimplementedDevicePluginServer
	devs []*pluginapi.Device
}

func (plainPlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p plainPlugin) ListAndWatch(_ *pluginapi.Empty, s pluginapi.DevicePlugin_ListAndWatchServer) error {
	if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: p.devs}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

// frameProxy forwards unix-socket connections to a target socket, reading
// the HTTP/2 frames that pass: it counts the keepalive pings the client
// sends and records the debug data of the GOAWAY frames the server sends.
// Once wedged it forwards nothing more, either way, and keeps every
// connection open until the test ends.
type frameProxy struct {
	lis    net.Listener
	target string
	done   chan struct{}
	wg     sync.WaitGroup

	mu     sync.Mutex
	st     proxyState
	wedged bool
	open   []net.Conn
}

type proxyState struct {
	conns   int      // connections accepted
	pings   int      // keepalive pings from the client (PING, no ACK, zero payload)
	goaways []string // debug data of each GOAWAY from the server
}

func newFrameProxy(t *testing.T, path, target string) *frameProxy {
	lis, err := net.Listen("unix", path)
	require.NoError(t, err)
	p := &frameProxy{lis: lis, target: target, done: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *frameProxy) state() proxyState {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.st
	st.goaways = append([]string(nil), p.st.goaways...)
	return st
}

func (p *frameProxy) wedge() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.wedged = true
}

func (p *frameProxy) close() {
	close(p.done)
	_ = p.lis.Close()
	p.mu.Lock()
	for _, c := range p.open {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *frameProxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.lis.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("unix", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		p.mu.Lock()
		p.st.conns++
		p.open = append(p.open, client, server)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.forward(client, server, true)
		go p.forward(server, client, false)
	}
}

// HTTP/2 frame types and flags the proxy looks at.
const (
	frameGoAway = 0x7
	framePing   = 0x6
	flagAck     = 0x1
)

// forward copies frames from src to dst until either fails, the proxy is
// wedged (then it waits for the end of the test) or closed; then it closes
// both, as one connection would be. fromClient: src is the manager, which
// starts with the HTTP/2 preface.
func (p *frameProxy) forward(src, dst net.Conn, fromClient bool) {
	defer p.wg.Done()
	defer src.Close()
	defer dst.Close()
	if fromClient {
		preface := make([]byte, len("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
		if _, err := io.ReadFull(src, preface); err != nil || !p.pass(dst, preface) {
			return
		}
	}
	header := make([]byte, 9)
	for {
		if _, err := io.ReadFull(src, header); err != nil {
			return
		}
		payload := make([]byte, int(header[0])<<16|int(header[1])<<8|int(header[2]))
		if _, err := io.ReadFull(src, payload); err != nil {
			return
		}
		p.observe(header[3], header[4], payload, fromClient)
		if !p.pass(dst, append(header[:9:9], payload...)) {
			return
		}
	}
}

// pass writes b to dst unless the proxy is wedged, in which case it waits
// for the proxy to close; false: stop forwarding.
func (p *frameProxy) pass(dst net.Conn, b []byte) bool {
	p.mu.Lock()
	wedged := p.wedged
	p.mu.Unlock()
	if wedged {
		<-p.done
		return false
	}
	_, err := dst.Write(b)
	return err == nil
}

func (p *frameProxy) observe(typ, flags byte, payload []byte, fromClient bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case fromClient && typ == framePing && flags&flagAck == 0 && len(payload) == 8 &&
		binary.BigEndian.Uint64(payload) == 0:
		p.st.pings++
	case !fromClient && typ == frameGoAway && len(payload) >= 8:
		p.st.goaways = append(p.st.goaways, string(payload[8:]))
	}
}

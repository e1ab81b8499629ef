//go:build reliability

package reliability

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/plugintest"
)

// Bad registrations: every malformed RegisterRequest (a version other than
// v1beta1 or an invalid resource name, refused with the kubelet's texts; an
// endpoint that is not a bare file name, which devmgr refuses and the kubelet
// does not: docs/ARCHITECTURE.md) is refused with an error whose text is
// asserted, before the manager dials anything for a bad version, name or
// endpoint string, and after a bounded dial-back for an endpoint that is not
// a device plugin.
// Between two cases a good plugin registers again and a pod is admitted;
// then a plugin registers the same resource in a hot loop of 1,000
// requests per second while the good plugin keeps admitting pods.

// stormRequests and stormRate: the hot loop.
const (
	stormRequests = 1000
	stormRate     = 1000 // per second
	stormWorkers  = 64
)

// badReg is one malformed registration: mutate turns a good request into it;
// the error must contain every string of want.
type badReg struct {
	name   string
	class  string
	mutate func(*pluginapi.RegisterRequest)
	want   []string
}

func TestBadRegistrations(t *testing.T) {
	fig := Figures{Category: "bad registrations"}
	defer recordOnExit(t, &fig, time.Now())
	leaks := newLeakCheck(t)
	// The dial-back to a socket that never speaks gRPC lasts DialTimeout.
	// It keeps its default: the registrations that must succeed, between
	// the cases, are held to it too.
	r := newRig(t).start()
	by := r.bystander()
	// The plugin the bad requests speak for: it serves, and must never be
	// dialled back by a refused request.
	target := r.plugin(resGPU, "gpu.sock", healthyDevices("d", 4))
	others := newNonPlugins(t, r.dir)
	defer others.stop()

	cases := badRegistrations(r.dir, target)
	fig.param("malformed requests sent", len(cases))
	refused := 0
	for _, tc := range cases {
		fig.Cases++
		t.Run(tc.class+"/"+tc.name, func(t *testing.T) {
			req := target.RegisterRequest()
			tc.mutate(req)
			err := r.registerWith(target, req)
			require.Error(t, err, "refused")
			// A refusal counts when the client got the error it must get.
			ok := assert.Equal(t, codes.Unknown, status.Code(err), "%v", err)
			for _, w := range tc.want {
				ok = assert.Contains(t, status.Convert(err).Message(), w) && ok
			}
			if ok {
				refused++
			}
			assert.NoError(t, r.m.HealthCheck())
			// A good plugin registers again and is served.
			require.NoError(t, by.p.Register(r.kubeletSocket()))
			by.admit(t)
		})
	}
	assert.Empty(t, target.CallsOf(plugintest.MethodGetDevicePluginOptions), "no refused request dialled the plugin back")
	c, _ := r.capacity(resGPU)
	assert.Equal(t, int64(-1), c, "nothing registered")
	checkWatcherValidation(t, r.m, cases)
	fig.exact(t, "malformed requests refused with the expected error", refused, len(cases))

	fig.Cases++
	assert.Equal(t, len(cases)+1, fig.Cases, "the malformed requests and the hot loop")
	storm := registrationStorm(t, r)
	fig.param("hot loop requests sent", stormRequests)
	fig.param("hot loop pace asked (per second)", stormRate)
	fig.exact(t, "hot loop requests answered (accepted, or refused naming the socket)", storm.accepted+storm.refused, stormRequests)
	fig.atLeast(t, "hot loop accepted (replacing the old one)", storm.accepted, 1)
	fig.atLeast(t, "good admissions during the hot loop", storm.admissions, 1)
	// The faults are what the client saw refused or answered.
	fig.Faults = refused + storm.accepted + storm.refused

	// The target registers properly at last.
	r.register(target)
	requireAllFree(t, r, "gpu-all", resGPU, 4)
	fig.Lost, fig.Doubled = r.audit()
	r.shutdown()
	others.stop()
	fds, goroutines := leaks.verify(t)
	fig.exact(t, "leaked fds", fds, 0)
	fig.exact(t, "leaked goroutines", goroutines, 0)
}

// badRegistrations lists the malformed requests: the version, every invalid
// class of resource name, endpoints that are not bare file names or name no
// usable socket, and sockets that answer but are not device plugins.
func badRegistrations(dir string, target *plugintest.Plugin) []badReg {
	version := func(v string) badReg {
		return badReg{name: fmt.Sprintf("%q", v), class: "version",
			mutate: func(r *pluginapi.RegisterRequest) { r.Version = v },
			want:   []string{fmt.Sprintf(`requested API version %q is not supported by kubelet. Supported version is ["v1beta1"]`, v)}}
	}
	name := func(why, n string) badReg {
		return badReg{name: why, class: "resource name",
			mutate: func(r *pluginapi.RegisterRequest) { r.ResourceName = n },
			want:   []string{fmt.Sprintf("the ResourceName %q is invalid", n)}}
	}
	endpoint := func(why, ep string, want ...string) badReg {
		return badReg{name: why, class: "endpoint",
			mutate: func(r *pluginapi.RegisterRequest) { r.Endpoint = ep },
			want:   want}
	}
	notBare := func(ep string) string {
		return fmt.Sprintf("invalid endpoint %q: must be a file name in %s, without '/' or NUL", ep, dir)
	}
	in := func(name string) string { return filepath.Join(dir, name) }
	// A domain of 245 bytes: "requests." plus it is 254, one over the
	// DNS-1123 subdomain limit (244 bytes is the longest accepted).
	longDomain := strings.Repeat("abcdefghi.", 24) + "examp.com"
	long200 := strings.Repeat("e", 200) + ".sock"
	return []badReg{
		version(""),
		version("v1alpha1"),
		version("v1beta2"),
		version("V1BETA1"),
		version(" v1beta1"),
		version("v1beta1\x00"),
		version("v1beta1,v1"),

		name("empty", ""),
		name("no domain", "gpu"),
		name("kubernetes.io domain", "kubernetes.io/gpu"),
		name("kubernetes.io subdomain", "nvidia.kubernetes.io/gpu"),
		name("requests. prefix", "requests.example.com/gpu"),
		name("two slashes", "example.com/gpu/0"),
		name("slash only", "/"),
		name("empty domain", "/gpu"),
		name("empty name part", "example.com/"),
		name("upper-case domain", "Example.com/gpu"),
		name("name part of 64 bytes", "example.com/"+strings.Repeat("g", 64)),
		name("domain of 245 bytes", longDomain+"/gpu"),
		name("space in name", "example.com/gp u"),
		name("bang in name", "example.com/gpu!"),
		name("underscore in domain", "exa_mple.com/gpu"),
		name("non-ASCII name", "example.com/gp\u00fc"),
		name("leading dash in name", "example.com/-gpu"),
		name("trailing dash in name", "example.com/gpu-"),
		name("trailing dot in name", "example.com/gpu."),
		name("leading dash in domain", "-example.com/gpu"),
		name("trailing dash in a domain label", "example-.com/gpu"),
		name("empty domain label", "example..com/gpu"),
		name("NUL in name", "example.com/gp\x00u"),
		name("newline after name", "example.com/gpu\n"),

		endpoint("empty", "", fmt.Sprintf("invalid endpoint %q: must be a file name in %s", "", dir)),
		endpoint("dot", ".", fmt.Sprintf("invalid endpoint %q: must be a file name in %s", ".", dir)),
		endpoint("dot-dot", "..", fmt.Sprintf("invalid endpoint %q: must be a file name in %s", "..", dir)),
		endpoint("with a slash", "sub/gpu.sock", notBare("sub/gpu.sock")),
		endpoint("escaping with ..", "../gpu.sock", notBare("../gpu.sock")),
		endpoint("absolute path", target.SocketPath(), notBare(target.SocketPath())),
		endpoint("trailing slash", "gpu.sock/", notBare("gpu.sock/")),
		endpoint("NUL inside", "gpu\x00.sock", notBare("gpu\x00.sock")),
		endpoint("NUL only", "\x00", notBare("\x00")),
		endpoint("4 KiB name", strings.Repeat("e", 4096),
			fmt.Sprintf("socket path is %d bytes, the limit is 107", len(in(strings.Repeat("e", 4096))))),
		endpoint("200-byte name", long200,
			fmt.Sprintf("socket path is %d bytes, the limit is 107", len(in(long200)))),
		endpoint("missing socket", "missing.sock", "failed to dial device plugin: socket "+in("missing.sock")+" does not exist"),
		endpoint("dangling symbolic link", "dangling.sock", "failed to dial device plugin: socket "+in("dangling.sock")+" does not exist"),
		endpoint("regular file", "regular.sock", "failed to dial device plugin: "+in("regular.sock")+" is not a unix socket"),
		endpoint("link to a regular file", "link.sock", "failed to dial device plugin: "+in("link.sock")+" is not a unix socket"),
		endpoint("directory", "dir.sock", "failed to dial device plugin: "+in("dir.sock")+" is not a unix socket"),
		endpoint("FIFO", "fifo.sock", "failed to dial device plugin: "+in("fifo.sock")+" is not a unix socket"),
		endpoint("the registration socket", devicemanager.KubeletSocketName,
			"failed to get device plugin options: "+in(devicemanager.KubeletSocketName), "code = Unimplemented"),
		endpoint("a gRPC server without the DevicePlugin service", "health.sock",
			"failed to get device plugin options: "+in("health.sock"), "code = Unimplemented", "unknown service v1beta1.DevicePlugin"),
		endpoint("a socket that answers HTTP garbage", "garbage.sock", "failed to dial device plugin: "+in("garbage.sock")),
		endpoint("a socket that accepts and never answers", "silent.sock", "failed to dial device plugin: "+in("silent.sock")),
	}
}

// checkWatcherValidation runs the bad versions and names through the
// plugin-registry path (ValidatePlugin): the same refusals.
func checkWatcherValidation(t *testing.T, m *devicemanager.ManagerImpl, cases []badReg) {
	t.Helper()
	h := m.GetWatcherHandler()
	for _, tc := range cases {
		req := &pluginapi.RegisterRequest{Version: pluginapi.Version, ResourceName: resGPU}
		tc.mutate(req)
		switch tc.class {
		case "version":
			err := h.ValidatePlugin(resGPU, "", []string{req.Version})
			assert.EqualError(t, err, fmt.Sprintf("manager version, v1beta1, is not among plugin supported versions [%s]", req.Version), tc.name)
		case "resource name":
			err := h.ValidatePlugin(req.ResourceName, "", []string{pluginapi.Version})
			assert.EqualError(t, err, fmt.Sprintf("invalid name of device plugin socket: the ResourceName %q is invalid", req.ResourceName), tc.name)
		}
	}
}

// nonPlugins are the files and sockets in the socket directory that bad
// endpoints name: a regular file, a directory, a FIFO, symbolic links, and
// sockets that answer without being device plugins.
type nonPlugins struct {
	once  sync.Once
	stops []func()
}

func newNonPlugins(t *testing.T, dir string) *nonPlugins {
	t.Helper()
	n := &nonPlugins{}
	t.Cleanup(n.stop)
	in := func(name string) string { return filepath.Join(dir, name) }
	require.NoError(t, os.WriteFile(in("regular.sock"), []byte("not a socket"), 0o600))
	require.NoError(t, os.Symlink(in("regular.sock"), in("link.sock")))
	require.NoError(t, os.Symlink(in("nowhere"), in("dangling.sock")))
	require.NoError(t, os.Mkdir(in("dir.sock"), 0o750))
	require.NoError(t, syscall.Mkfifo(in("fifo.sock"), 0o600))

	n.stops = append(n.stops, rawSocket(t, in("garbage.sock"), func(c net.Conn) {
		_, _ = io.WriteString(c, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
	}))
	n.stops = append(n.stops, rawSocket(t, in("silent.sock"), func(c net.Conn) {
		_, _ = io.Copy(io.Discard, c) // until the client or stop closes it
	}))

	lis, err := net.Listen("unix", in("health.sock"))
	require.NoError(t, err)
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(lis)
	}()
	n.stops = append(n.stops, func() {
		srv.Stop()
		<-served
	})
	return n
}

// stop stops every server; idempotent.
func (n *nonPlugins) stop() {
	n.once.Do(func() {
		for _, s := range n.stops {
			s()
		}
	})
}

// rawSocket listens on path and hands each connection to serve, then closes
// it. The returned stop closes the listener and every open connection and
// waits for the goroutines.
func rawSocket(t *testing.T, path string, serve func(net.Conn)) (stop func()) {
	t.Helper()
	lis, err := net.Listen("unix", path)
	require.NoError(t, err)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns = map[net.Conn]struct{}{}
	)
	wg.Go(func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = struct{}{}
			mu.Unlock()
			wg.Go(func() {
				defer func() {
					mu.Lock()
					delete(conns, c)
					mu.Unlock()
					_ = c.Close()
				}()
				serve(c)
			})
		}
	})
	return func() {
		_ = lis.Close()
		mu.Lock()
		for c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}
}

// stormResult is what the hot loop did.
type stormResult struct {
	requests, accepted, refused, admissions int
	rate                                    int
	slowest                                 time.Duration
}

// registrationStorm makes one plugin register the same resource on the same
// socket stormRequests times, paced at stormRate per second (stormWorkers
// concurrent senders on one connection to kubelet.sock, so that the pace is
// the manager's to keep), while the good plugin admits pods. The rate
// achieved, which depends on the machine and its load, is in the test's log
// only. Each request is
// accepted (replacing the previous connection, where the kubelet would refuse
// it: see docs/ARCHITECTURE.md) or refused with an error naming the socket;
// afterwards one connection serves the resource.
func registrationStorm(t *testing.T, r *rig) stormResult {
	t.Helper()
	p := r.plugin(resNIC, "storm.sock", healthyDevices("n", 4))
	conn, err := grpc.NewClient("unix://"+r.kubeletSocket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	client := pluginapi.NewRegistrationClient(conn)
	errs := make([]error, stormRequests)
	jobs := make(chan int)
	var senders sync.WaitGroup
	for range stormWorkers {
		senders.Go(func() {
			for i := range jobs {
				ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
				_, errs[i] = client.Register(ctx, p.RegisterRequest(), grpc.WaitForReady(true))
				cancel()
			}
		})
	}

	// The good plugin admits pods until the storm is over.
	stop := make(chan struct{})
	var (
		admitted     atomic.Int64
		slowest      atomic.Int64
		admissionErr atomic.Value
		admitter     sync.WaitGroup
	)
	admitter.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			pod := podOf(fmt.Sprintf("storm-by-%d", i), resBystander, 1)
			begin := time.Now()
			if err := r.admit(pod); err != nil {
				admissionErr.Store(err)
				return
			}
			if d := time.Since(begin); d > time.Duration(slowest.Load()) {
				slowest.Store(int64(d))
			}
			r.release(pod)
			admitted.Add(1)
		}
	})

	ticker := time.NewTicker(time.Second / stormRate)
	begin := time.Now()
	for i := range stormRequests {
		<-ticker.C
		jobs <- i
	}
	close(jobs)
	senders.Wait()
	elapsed := time.Since(begin)
	ticker.Stop()
	close(stop)
	admitter.Wait()

	res := stormResult{requests: stormRequests, admissions: int(admitted.Load()),
		slowest: time.Duration(slowest.Load()), rate: int(float64(stormRequests) / elapsed.Seconds())}
	if err, ok := admissionErr.Load().(error); ok {
		t.Errorf("a good plugin's admission failed during the hot loop: %v", err)
	}
	assert.Positive(t, res.admissions, "the good plugin was served during the hot loop")
	for i, err := range errs {
		switch {
		case err == nil:
			res.accepted++
		case assert.Contains(t, err.Error(), p.SocketPath(), "request %d refused without naming the socket", i):
			res.refused++
		}
	}
	t.Logf("hot loop: %d requests in %v (%d/s), %d accepted, %d refused; %d good admissions meanwhile, slowest %v",
		res.requests, elapsed.Round(time.Millisecond), res.rate, res.accepted, res.refused, res.admissions, res.slowest)
	require.Positive(t, res.accepted)

	waitFor(t, func() bool { return p.Streams() == 1 }, "one connection left after the hot loop")
	r.waitCapacity(resNIC, 4, 4)
	requireAllFree(t, r, "storm-all", resNIC, 4)
	r.by.admit(t)
	return res
}

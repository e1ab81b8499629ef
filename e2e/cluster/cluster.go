// Package cluster runs the control plane the end-to-end tests talk to: etcd,
// kube-apiserver and kube-scheduler on loopback, built once from the Go
// module proxy into a cache outside the repository. make e2e (this module)
// and make node-e2e (module nodee2e) both use it.
package cluster

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// The modules and packages of the control plane, and how long a stopping
// process may take.
const (
	kubeModule   = "k8s.io/kubernetes"
	etcdModule   = "go.etcd.io/etcd/server/v3"
	apiserverPkg = "k8s.io/kubernetes/cmd/kube-apiserver"
	schedulerPkg = "k8s.io/kubernetes/cmd/kube-scheduler"
	processGrace = 10 * time.Second
)

// CacheEnv names the directory the components are cached in; default
// devmgr/e2e in the user's cache directory ($XDG_CACHE_HOME or ~/.cache).
const CacheEnv = "DEVMGR_E2E_CACHE"

// CacheDir is $DEVMGR_E2E_CACHE, or devmgr/e2e in the user's cache
// directory.
func CacheDir() (string, error) {
	if dir := os.Getenv(CacheEnv); dir != "" {
		return filepath.Abs(dir)
	}
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no cache directory for the e2e binaries (set %s): %w", CacheEnv, err)
	}
	return filepath.Join(dir, "devmgr", "e2e"), nil
}

// ModuleDir is the directory of the e2e module, whose go.mod pins the
// control plane's versions.
func ModuleDir() string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		panic("cluster: no caller information")
	}
	return filepath.Dir(filepath.Dir(file))
}

// ModuleVersion is the version of module that the go.mod in dir selects.
func ModuleVersion(dir, module string) (string, error) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Version}}", module)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go list -m %s: %w", module, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// Build is one binary to build: package Pkg of the module in Dir, into Out.
// One that exists already is kept unless Always.
type Build struct {
	Dir, Pkg, Out string
	Always        bool
}

// BuildAll builds what is missing, logging to log how long each build took.
func BuildAll(log io.Writer, builds ...Build) error {
	for _, b := range builds {
		if _, err := os.Stat(b.Out); err == nil && !b.Always {
			fmt.Fprintf(log, "build: %s cached\n", filepath.Base(b.Out))
			continue
		}
		start := time.Now()
		// Built under a name of this run's and renamed, so that another run
		// sharing the cache never sees half a binary.
		tmp := fmt.Sprintf("%s.%d", b.Out, os.Getpid())
		cmd := exec.Command("go", "build", "-o", tmp, b.Pkg)
		cmd.Dir = b.Dir
		if out, err := cmd.CombinedOutput(); err != nil {
			_ = os.Remove(tmp)
			return fmt.Errorf("go build %s: %w\n%s", b.Pkg, err, out)
		}
		if err := os.Rename(tmp, b.Out); err != nil {
			return err
		}
		fmt.Fprintf(log, "build: %s in %s\n", filepath.Base(b.Out), time.Since(start).Round(time.Second))
	}
	return nil
}

// Binaries are the control plane's executables.
type Binaries struct{ Etcd, APIServer, Scheduler string }

// ControlPlane names the control plane's binaries in binDir, under names
// that carry their module's version, so that a version change builds them
// again, and returns the builds that make them: etcd from the module
// e2e/etcd (k8s.io/kubernetes requires a newer etcd), kube-apiserver and
// kube-scheduler from the e2e module.
func ControlPlane(binDir string) (Binaries, []Build, error) {
	dir := ModuleDir()
	kubeVersion, err := ModuleVersion(dir, kubeModule)
	if err != nil {
		return Binaries{}, nil, err
	}
	etcdDir := filepath.Join(dir, "etcd")
	etcdVersion, err := ModuleVersion(etcdDir, etcdModule)
	if err != nil {
		return Binaries{}, nil, err
	}
	b := Binaries{
		Etcd:      filepath.Join(binDir, "etcd-"+etcdVersion),
		APIServer: filepath.Join(binDir, "kube-apiserver-"+kubeVersion),
		Scheduler: filepath.Join(binDir, "kube-scheduler-"+kubeVersion),
	}
	return b, []Build{
		{Dir: etcdDir, Pkg: ".", Out: b.Etcd},
		{Dir: dir, Pkg: apiserverPkg, Out: b.APIServer},
		{Dir: dir, Pkg: schedulerPkg, Out: b.Scheduler},
	}, nil
}

// Process is a component running for one test, its output in a file.
type Process struct {
	Name   string
	Cmd    *exec.Cmd
	Log    string
	Exited chan struct{} // closed once the process is reaped
}

// Start runs bin with args, its output in dir/name.log; the process is
// stopped when the test ends, and killed with the test process if that
// dies first.
func Start(t testing.TB, dir, name, bin string, args ...string) *Process {
	t.Helper()
	return StartCmd(t, dir, name, exec.Command(bin, args...))
}

// StartCmd is Start with a command of the caller's (its environment, its
// working directory).
func StartCmd(t testing.TB, dir, name string, cmd *exec.Cmd) *Process {
	t.Helper()
	p, err := Launch(dir, name, cmd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.StopAndReport(t) })
	return p
}

// Launch starts cmd, its output in dir/name.log, killed with the test
// process if that dies first. Unlike StartCmd, nothing stops it when a test
// ends: the caller owns it.
func Launch(dir, name string, cmd *exec.Cmd) (*Process, error) {
	p := &Process{Name: name, Cmd: cmd, Log: filepath.Join(dir, name+".log"), Exited: make(chan struct{})}
	out, err := os.Create(p.Log)
	if err != nil {
		return nil, err
	}
	p.Cmd.Stdout, p.Cmd.Stderr = out, out
	p.Cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.Cmd.Start(); err != nil {
		_ = out.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		_ = p.Cmd.Wait() // the exit status is in Cmd.ProcessState
		_ = out.Close()
		close(p.Exited)
	}()
	return p, nil
}

// StopAndReport stops the process and, when t failed, logs the end of its
// output.
func (p *Process) StopAndReport(t testing.TB) {
	t.Helper()
	p.Stop()
	if t.Failed() {
		t.Logf("%s output (last 4 KiB):\n%s", p.Name, Tail([]byte(p.Output()), 4096))
	}
}

// Running reports whether the process has not exited yet.
func (p *Process) Running() bool {
	select {
	case <-p.Exited:
		return false
	default:
		return true
	}
}

// Stop sends SIGTERM, kills after processGrace, and returns the exit code
// (-1 for a signal).
func (p *Process) Stop() int {
	select {
	case <-p.Exited:
	default:
		_ = p.Cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.Exited:
		case <-time.After(processGrace):
			_ = p.Cmd.Process.Kill()
			<-p.Exited
		}
	}
	return p.Cmd.ProcessState.ExitCode()
}

// Kill kills the process at once, as a crash would, and waits until it is
// reaped.
func (p *Process) Kill() {
	_ = p.Cmd.Process.Kill()
	<-p.Exited
}

// Output is what the process has written so far.
func (p *Process) Output() string {
	b, _ := os.ReadFile(p.Log)
	return string(b)
}

// Tail is the last n bytes of b.
func Tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// ErrPortTaken means a component exited because a port it was given was
// taken.
var ErrPortTaken = errors.New("port taken")

// startAttempts is how many times OnFreePorts starts a component.
const startAttempts = 3

// OnFreePorts calls launch, which starts a component on ports and waits
// until it serves, with n ports that were free a moment ago. Another process
// may take one before the component binds it; launch then returns
// ErrPortTaken, and is called again on new ports, startAttempts times in
// all. launch names the logs and data of its attempt with AttemptName.
func OnFreePorts(t testing.TB, n int, launch func(ports []int, attempt int) error) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		ports := make([]int, n)
		for i := range ports {
			ports[i] = FreePort(t)
		}
		err := launch(ports, attempt)
		if err == nil {
			return
		}
		if !errors.Is(err, ErrPortTaken) || attempt == startAttempts {
			t.Fatal(err)
		}
		t.Logf("%v: starting it again on other ports", err)
	}
}

// AttemptName is name for the first attempt, name-2 for the second, and so
// on, so that no attempt overwrites the log or data of another.
func AttemptName(name string, attempt int) string {
	if attempt == 1 {
		return name
	}
	return fmt.Sprintf("%s-%d", name, attempt)
}

// Cluster is etcd, kube-apiserver and kube-scheduler on loopback.
type Cluster struct {
	Dir        string
	Kubeconfig string
	Client     kubernetes.Interface
	Scheduler  *Process
	// The API server, its URL and its arguments, to start it again.
	APIServer     *Process
	Server        string
	bins          Binaries
	apiserverArgs []string
}

// Token is the bearer token of the cluster's administrator, the identity in
// Kubeconfig.
const Token = "e2e-admin-token"

// StartCluster starts etcd, the API server (token authentication, every
// request allowed, a service-account key pair made here, and extraArgs) and
// the scheduler, and returns once the API server is ready.
func StartCluster(t testing.TB, dir string, bins Binaries, extraArgs ...string) *Cluster {
	t.Helper()
	c := &Cluster{Dir: dir, bins: bins}
	var etcdURL string
	OnFreePorts(t, 2, func(ports []int, attempt int) error {
		etcdURL = fmt.Sprintf("http://127.0.0.1:%d", ports[0])
		peerURL := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
		name := AttemptName("etcd", attempt)
		etcd := Start(t, dir, name, bins.Etcd, "--name", "e2e", "--data-dir", filepath.Join(dir, name),
			"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
			"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
			"--initial-cluster", "e2e="+peerURL, "--unsafe-no-fsync", "--log-level", "warn")
		return AwaitHTTP(etcd, etcdURL+"/health", "")
	})

	pub, priv := serviceAccountKeys(t, dir)
	tokens := filepath.Join(dir, "tokens.csv")
	WriteFile(t, tokens, Token+`,admin,admin-uid,"system:masters"`+"\n")
	OnFreePorts(t, 1, func(ports []int, attempt int) error {
		c.apiserverArgs = append([]string{"--etcd-servers", etcdURL, "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
			"--secure-port", fmt.Sprint(ports[0]), "--cert-dir", filepath.Join(dir, "apiserver-certs"),
			"--token-auth-file", tokens, "--authorization-mode", "AlwaysAllow",
			"--service-account-issuer", "https://kubernetes.default.svc", "--service-account-key-file", pub,
			"--service-account-signing-key-file", priv, "--service-cluster-ip-range", "10.96.0.0/24",
			"--endpoint-reconciler-type", "none"}, extraArgs...)
		c.Server = fmt.Sprintf("https://127.0.0.1:%d", ports[0])
		return c.launchAPIServer(t, AttemptName("kube-apiserver", attempt))
	})

	c.Kubeconfig = filepath.Join(dir, "kubeconfig")
	WriteFile(t, c.Kubeconfig, fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: e2e, cluster: {server: %q, insecure-skip-tls-verify: true}}]
users: [{name: admin, user: {token: %q}}]
contexts: [{name: e2e, context: {cluster: e2e, user: admin}}]
current-context: e2e
`, c.Server, Token))
	rc, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if c.Client, err = kubernetes.NewForConfig(rc); err != nil {
		t.Fatal(err)
	}
	// The scheduler serves no port (--secure-port 0): the tests read
	// nothing from it.
	c.Scheduler = Start(t, dir, "kube-scheduler", bins.Scheduler,
		"--kubeconfig", c.Kubeconfig, "--leader-elect=false", "--secure-port", "0")
	return c
}

// StartAPIServer starts the API server, its output in name.log, and waits
// until it is ready. The API server keeps its port and its etcd across
// restarts.
func (c *Cluster) StartAPIServer(t testing.TB, name string) {
	t.Helper()
	if err := c.launchAPIServer(t, name); err != nil {
		t.Fatal(err)
	}
}

// launchAPIServer is StartAPIServer returning its error.
func (c *Cluster) launchAPIServer(t testing.TB, name string) error {
	t.Helper()
	c.APIServer = Start(t, c.Dir, name, c.bins.APIServer, c.apiserverArgs...)
	return AwaitHTTP(c.APIServer, c.Server+"/readyz", Token)
}

// AwaitHTTP waits up to a minute for url to answer 200 (with a bearer
// token when one is given). It returns an error at once if p exits,
// wrapping ErrPortTaken when p said a port was taken.
func AwaitHTTP(p *Process, url, bearer string) error {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the components' own self-signed certificates
	}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := client.Do(req)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = errors.New(resp.Status)
		}
		last = err
		select {
		case <-p.Exited:
			err := fmt.Errorf("%s exited (%s)", p.Name, p.Cmd.ProcessState)
			if strings.Contains(p.Output(), "address already in use") {
				return fmt.Errorf("%w: %w", ErrPortTaken, err)
			}
			return err
		case <-ctx.Done():
			return fmt.Errorf("%s: %s did not answer 200 within a minute: %w", p.Name, url, last)
		case <-tick.C:
		}
	}
}

// Poll checks cond every 100ms until it holds, failing the test after limit
// or as soon as p exits (p may be nil).
func Poll(t testing.TB, ctx context.Context, p *Process, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	if err := PollErr(ctx, p, limit, cond); err != nil {
		t.Fatalf("waiting %s for %s: %v", limit, what, err)
	}
}

// PollErr is Poll returning its error.
func PollErr(ctx context.Context, p *Process, limit time.Duration, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var exited <-chan struct{}
	if p != nil {
		exited = p.Exited
	}
	return wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(context.Context) (bool, error) {
		select {
		case <-exited:
			return false, fmt.Errorf("%s exited (%s)", p.Name, p.Cmd.ProcessState)
		default:
		}
		return cond(), nil
	})
}

// serviceAccountKeys writes a new RSA key pair and returns the paths of
// its public and private halves.
func serviceAccountKeys(t testing.TB, dir string) (pub, priv string) {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	pub, priv = filepath.Join(dir, "sa.pub"), filepath.Join(dir, "sa.key")
	WriteFile(t, pub, string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})))
	WriteFile(t, priv, string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})))
	return pub, priv
}

// WriteFile writes content to path, failing the test on error.
func WriteFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

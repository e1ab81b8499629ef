package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// The packages the tests run, and how long a stopping process may take.
const (
	kubeModule   = "k8s.io/kubernetes"
	etcdModule   = "go.etcd.io/etcd/server/v3"
	apiserverPkg = "k8s.io/kubernetes/cmd/kube-apiserver"
	schedulerPkg = "k8s.io/kubernetes/cmd/kube-scheduler"
	devmgrPkg    = "./cmd/devmgr"
	processGrace = 10 * time.Second
)

// cacheEnv names the directory the components are cached in; default
// devmgr/e2e in the user's cache directory ($XDG_CACHE_HOME or ~/.cache).
const cacheEnv = "DEVMGR_E2E_CACHE"

// Binaries: the components built once into binDir, outside the repository,
// under names that carry their module's version, so that a version change
// builds them again; devmgr, the code under test, built for each run into
// devmgrDir, removed by TestMain.
var (
	binDir, devmgrDir, repoRoot                    string
	etcdBin, apiserverBin, schedulerBin, devmgrBin string
	buildOnce                                      sync.Once
	errBuild                                       error
	buildLog                                       bytes.Buffer
)

// buildAll builds what is missing: etcd (in module e2e/etcd),
// kube-apiserver and kube-scheduler (this module), and always devmgr (the
// code under test), logging how long each took.
func buildAll() error {
	wd, err := os.Getwd()
	if err != nil {
		return err
	}
	repoRoot = filepath.Dir(wd)
	if binDir, err = cacheDir(); err != nil {
		return err
	}
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return err
	}
	if devmgrDir, err = os.MkdirTemp("", "e2e-devmgr"); err != nil {
		return err
	}
	kubeVersion, err := moduleVersion(wd, kubeModule)
	if err != nil {
		return err
	}
	etcdDir := filepath.Join(wd, "etcd")
	etcdVersion, err := moduleVersion(etcdDir, etcdModule)
	if err != nil {
		return err
	}
	etcdBin = filepath.Join(binDir, "etcd-"+etcdVersion)
	apiserverBin = filepath.Join(binDir, "kube-apiserver-"+kubeVersion)
	schedulerBin = filepath.Join(binDir, "kube-scheduler-"+kubeVersion)
	devmgrBin = filepath.Join(devmgrDir, "devmgr")
	for _, b := range []struct {
		dir, pkg, out string
		always        bool
	}{
		{etcdDir, ".", etcdBin, false},
		{wd, apiserverPkg, apiserverBin, false},
		{wd, schedulerPkg, schedulerBin, false},
		{repoRoot, devmgrPkg, devmgrBin, true},
	} {
		if _, err := os.Stat(b.out); err == nil && !b.always {
			fmt.Fprintf(&buildLog, "build: %s cached\n", filepath.Base(b.out))
			continue
		}
		start := time.Now()
		// Built under a name of this run's and renamed, so that another run
		// sharing the cache never sees half a binary.
		tmp := fmt.Sprintf("%s.%d", b.out, os.Getpid())
		cmd := exec.Command("go", "build", "-o", tmp, b.pkg)
		cmd.Dir = b.dir
		if out, err := cmd.CombinedOutput(); err != nil {
			_ = os.Remove(tmp)
			return fmt.Errorf("go build %s: %w\n%s", b.pkg, err, out)
		}
		if err := os.Rename(tmp, b.out); err != nil {
			return err
		}
		fmt.Fprintf(&buildLog, "build: %s in %s\n", filepath.Base(b.out), time.Since(start).Round(time.Second))
	}
	return nil
}

// cacheDir is $DEVMGR_E2E_CACHE, or devmgr/e2e in the user's cache
// directory.
func cacheDir() (string, error) {
	if dir := os.Getenv(cacheEnv); dir != "" {
		return filepath.Abs(dir)
	}
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no cache directory for the e2e binaries (set %s): %w", cacheEnv, err)
	}
	return filepath.Join(dir, "devmgr", "e2e"), nil
}

// moduleVersion is the version of module that the go.mod in dir selects.
func moduleVersion(dir, module string) (string, error) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Version}}", module)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go list -m %s: %w", module, err)
	}
	return strings.TrimSpace(string(out)), nil
}

func TestMain(m *testing.M) {
	code := m.Run()
	if devmgrDir != "" {
		_ = os.RemoveAll(devmgrDir)
	}
	os.Exit(code)
}

// binaries builds everything once and fails the test if that failed.
func binaries(t *testing.T) {
	t.Helper()
	buildOnce.Do(func() { errBuild = buildAll() })
	t.Log("e2e binaries in " + binDir + "\n" + strings.TrimSpace(buildLog.String()))
	if errBuild != nil {
		t.Fatal(errBuild)
	}
}

// process is a component running for one test, its output in a file.
type process struct {
	name   string
	cmd    *exec.Cmd
	log    string
	exited chan struct{} // closed once the process is reaped
}

// start runs bin with args; the process is stopped when the test ends, and
// killed with the test process if that dies first.
func start(t *testing.T, dir, name, bin string, args ...string) *process {
	t.Helper()
	p := &process{name: name, log: filepath.Join(dir, name+".log"), exited: make(chan struct{})}
	out, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = out, out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		_ = out.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		_ = p.cmd.Wait() // the exit status is in cmd.ProcessState
		_ = out.Close()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			if b, err := os.ReadFile(p.log); err == nil {
				t.Logf("%s output (last 4 KiB):\n%s", name, tail(b, 4096))
			}
		}
	})
	return p
}

// stop sends SIGTERM, kills after processGrace, and returns the exit code
// (-1 for a signal).
func (p *process) stop() int {
	select {
	case <-p.exited:
	default:
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(processGrace):
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	}
	return p.cmd.ProcessState.ExitCode()
}

func (p *process) output() string {
	b, _ := os.ReadFile(p.log)
	return string(b)
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// errPortTaken: a component exited because a port it was given was taken.
var errPortTaken = errors.New("port taken")

// startAttempts is how many times onFreePorts starts a component.
const startAttempts = 3

// onFreePorts calls launch, which starts a component on ports and waits
// until it serves, with n ports that were free a moment ago. Another process
// may take one before the component binds it; launch then returns
// errPortTaken, and is called again on new ports, startAttempts times in
// all. launch names the logs and data of its attempt with attemptName.
func onFreePorts(t *testing.T, n int, launch func(ports []int, attempt int) error) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		ports := make([]int, n)
		for i := range ports {
			ports[i] = freePort(t)
		}
		err := launch(ports, attempt)
		if err == nil {
			return
		}
		if !errors.Is(err, errPortTaken) || attempt == startAttempts {
			t.Fatal(err)
		}
		t.Logf("%v: starting it again on other ports", err)
	}
}

// attemptName is name for the first attempt, name-2 for the second, and so
// on, so that no attempt overwrites the log or data of another.
func attemptName(name string, attempt int) string {
	if attempt == 1 {
		return name
	}
	return fmt.Sprintf("%s-%d", name, attempt)
}

// cluster is etcd, kube-apiserver and kube-scheduler on loopback.
type cluster struct {
	dir        string
	kubeconfig string
	client     kubernetes.Interface
	scheduler  *process
	// The API server, its URL and its arguments, to start it again.
	apiserver     *process
	server        string
	apiserverArgs []string
}

const token = "e2e-admin-token"

// startCluster starts etcd, the API server (token authentication, every
// request allowed, a service-account key pair made here) and the
// scheduler, and returns once the API server is ready.
func startCluster(t *testing.T, dir string) *cluster {
	t.Helper()
	c := &cluster{dir: dir}
	var etcdURL string
	onFreePorts(t, 2, func(ports []int, attempt int) error {
		etcdURL = fmt.Sprintf("http://127.0.0.1:%d", ports[0])
		peerURL := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
		name := attemptName("etcd", attempt)
		etcd := start(t, dir, name, etcdBin, "--name", "e2e", "--data-dir", filepath.Join(dir, name),
			"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
			"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
			"--initial-cluster", "e2e="+peerURL, "--unsafe-no-fsync", "--log-level", "warn")
		return awaitHTTP(etcd, etcdURL+"/health", "")
	})

	pub, priv := serviceAccountKeys(t, dir)
	tokens := filepath.Join(dir, "tokens.csv")
	writeFile(t, tokens, token+`,admin,admin-uid,"system:masters"`+"\n")
	onFreePorts(t, 1, func(ports []int, attempt int) error {
		c.apiserverArgs = []string{"--etcd-servers", etcdURL, "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
			"--secure-port", fmt.Sprint(ports[0]), "--cert-dir", filepath.Join(dir, "apiserver-certs"),
			"--token-auth-file", tokens, "--authorization-mode", "AlwaysAllow",
			"--service-account-issuer", "https://kubernetes.default.svc", "--service-account-key-file", pub,
			"--service-account-signing-key-file", priv, "--service-cluster-ip-range", "10.96.0.0/24",
			"--endpoint-reconciler-type", "none"}
		c.server = fmt.Sprintf("https://127.0.0.1:%d", ports[0])
		return c.launchAPIServer(t, attemptName("kube-apiserver", attempt))
	})

	c.kubeconfig = filepath.Join(dir, "kubeconfig")
	writeFile(t, c.kubeconfig, fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: e2e, cluster: {server: %q, insecure-skip-tls-verify: true}}]
users: [{name: admin, user: {token: %q}}]
contexts: [{name: e2e, context: {cluster: e2e, user: admin}}]
current-context: e2e
`, c.server, token))
	rc, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if c.client, err = kubernetes.NewForConfig(rc); err != nil {
		t.Fatal(err)
	}
	// The scheduler serves no port (--secure-port 0): the tests read
	// nothing from it.
	c.scheduler = start(t, dir, "kube-scheduler", schedulerBin,
		"--kubeconfig", c.kubeconfig, "--leader-elect=false", "--secure-port", "0")
	return c
}

// startAPIServer starts the API server, its output in name.log, and waits
// until it is ready. The API server keeps its port and its etcd across
// restarts.
func (c *cluster) startAPIServer(t *testing.T, name string) {
	t.Helper()
	if err := c.launchAPIServer(t, name); err != nil {
		t.Fatal(err)
	}
}

// launchAPIServer is startAPIServer returning its error.
func (c *cluster) launchAPIServer(t *testing.T, name string) error {
	t.Helper()
	c.apiserver = start(t, c.dir, name, apiserverBin, c.apiserverArgs...)
	return awaitHTTP(c.apiserver, c.server+"/readyz", token)
}

// awaitHTTP waits up to a minute for url to answer 200 (with a bearer
// token when one is given). It returns an error at once if p exits,
// wrapping errPortTaken when p said a port was taken.
func awaitHTTP(p *process, url, bearer string) error {
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
		case <-p.exited:
			err := fmt.Errorf("%s exited (%s)", p.name, p.cmd.ProcessState)
			if strings.Contains(p.output(), "address already in use") {
				return fmt.Errorf("%w: %w", errPortTaken, err)
			}
			return err
		case <-ctx.Done():
			return fmt.Errorf("%s: %s did not answer 200 within a minute: %w", p.name, url, last)
		case <-tick.C:
		}
	}
}

// serviceAccountKeys writes a new RSA key pair and returns the paths of
// its public and private halves.
func serviceAccountKeys(t *testing.T, dir string) (pub, priv string) {
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
	writeFile(t, pub, string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})))
	writeFile(t, priv, string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})))
	return pub, priv
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestComponentsAreCachedOutsideTheRepository(t *testing.T) {
	xdg := filepath.Join(os.TempDir(), "xdg-cache")
	t.Setenv("XDG_CACHE_HOME", xdg)
	t.Setenv(cacheEnv, "")
	dir, err := cacheDir()
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(xdg, "devmgr", "e2e"); dir != want {
		t.Fatalf("cache directory %s, want %s", dir, want)
	}
	t.Setenv(cacheEnv, "elsewhere")
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	if dir, err = cacheDir(); err != nil || dir != filepath.Join(wd, "elsewhere") {
		t.Fatalf("with %s=elsewhere: cache directory %s (%v), want %s", cacheEnv, dir, err, filepath.Join(wd, "elsewhere"))
	}
}

package kubeletcompat_test

import (
	"bufio"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/server/healthz"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	kubeletdm "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"

	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/kubeletcompat"
)

// healthAnswers is what a device manager's health checker answers through
// its life; "" is a pass.
type healthAnswers struct {
	BeforeStart, RegistrationFailed, AfterStop string
}

// healthSide starts one device manager whose logger is log and returns its
// health checker, its kubelet.sock, and its Start and Stop.
type healthSide func(t *testing.T, log klog.Logger) (hc healthz.HealthChecker, sock string, start, stop func() error)

func kubeletHealthSide(t *testing.T, log klog.Logger) (healthz.HealthChecker, string, func() error, func() error) {
	needKubelet(t)
	emptyKubeletDir(t)
	m, err := kubeletdm.NewManagerImpl(log, machineNodes(), nil)
	require.NoError(t, err)
	start := func() error {
		return m.Start(log, (&pods{}).get, ready{}, containermap.NewContainerMap(), sets.New[string]())
	}
	return m.GetHealthChecker(), filepath.Join(pluginapi.DevicePluginPath, "kubelet.sock"), start,
		func() error { return m.Stop(log) }
}

func adapterHealthSide(t *testing.T, log klog.Logger) (healthz.HealthChecker, string, func() error, func() error) {
	dir := shortDir(t)
	m, err := kubeletcompat.New(devicemanager.Options{SocketDir: dir, Logger: log}, nil)
	require.NoError(t, err)
	start := func() error {
		return m.Start(logger, (&pods{}).get, ready{}, containermap.NewContainerMap(), sets.New[string]())
	}
	return m.GetHealthChecker(), filepath.Join(dir, "kubelet.sock"), start, func() error { return m.Stop(logger) }
}

// lifeOfHealth records the answers of one side's checker: before Start,
// once its registration server has failed (its listening socket shut down)
// and after Stop. The failure is seen through the error the manager logs
// after it records the failure. (The kubelet's checker is not asked while it
// serves: its serving goroutine sets the answer without a lock.)
func lifeOfHealth(t *testing.T, side healthSide) healthAnswers {
	failed := make(chan struct{})
	var once sync.Once
	log := funcr.New(func(_, args string) {
		if strings.Contains(args, `"error"=`) && strings.Contains(args, "accept4") {
			once.Do(func() { close(failed) })
		}
	}, funcr.Options{})
	hc, sock, start, stop := side(t, log)
	req, err := http.NewRequest(http.MethodGet, "/healthz", nil)
	require.NoError(t, err)
	answer := func() string {
		if err := hc.Check(req); err != nil {
			return strings.ReplaceAll(err.Error(), sock, "<kubelet.sock>")
		}
		return ""
	}
	var got healthAnswers
	got.BeforeStart = answer()
	require.NoError(t, start())
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = stop()
		}
	})
	shutdownListener(t, sock)
	select {
	case <-failed:
	case <-time.After(10 * time.Second):
		require.FailNow(t, "the registration server did not fail")
	}
	got.RegistrationFailed = answer()
	stopped = true
	require.NoError(t, stop())
	got.AfterStop = answer()
	return got
}

// The checker fails once the registration server has failed, with the
// kubelet's message, and passes after Stop: the kubelet's Stop counts a
// stopped manager as healthy, whatever failed before.
func TestHealthCheckerAnswersAsTheKubeletsWhenRegistrationFails(t *testing.T) {
	want := healthAnswers{
		RegistrationFailed: "device registration error: device plugin registration gRPC server failed and no " +
			"device plugins can register: accept unix <kubelet.sock>: accept4: invalid argument",
	}
	kubelet := lifeOfHealth(t, kubeletHealthSide)
	require.Equal(t, want, kubelet, "the kubelet's checker")
	assert.Equal(t, kubelet, lifeOfHealth(t, adapterHealthSide), "the adapter's checker")
}

// shutdownListener shuts down this process's listening unix socket bound to
// path, as a failing socket would: its Accept then fails for good. The
// socket stays open; its owner closes it.
func shutdownListener(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open("/proc/net/unix")
	require.NoError(t, err)
	defer f.Close()
	// Num RefCount Protocol Flags Type St Inode Path; a listening socket has
	// the flag __SO_ACCEPTCON (00010000).
	inode := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 8 && fields[7] == path && fields[3] == "00010000" {
			inode = fields[6]
		}
	}
	require.NoError(t, sc.Err())
	require.NotEmpty(t, inode, "no listening socket on %s", path)
	fds, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	for _, e := range fds {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil || target != "socket:["+inode+"]" {
			continue
		}
		fd, err := strconv.Atoi(e.Name())
		require.NoError(t, err)
		// A non-blocking listener's accept answers EAGAIN after the
		// shutdown and its Accept waits on; a blocking one's fails.
		require.NoError(t, unix.SetNonblock(fd, false))
		require.NoError(t, unix.Shutdown(fd, unix.SHUT_RDWR))
		return
	}
	require.FailNow(t, "the listening socket is not this process's", "%s (inode %s)", path, inode)
}

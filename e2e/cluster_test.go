package e2e

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/openkubelet/devmgr/e2e/cluster"
)

// The control plane is built once into binDir, outside the repository;
// devmgr, the code under test, is built for each run into devmgrDir,
// removed by TestMain.
var (
	binDir, devmgrDir string
	bins              cluster.Binaries
	devmgrBin         string
	buildOnce         sync.Once
	errBuild          error
	buildLog          bytes.Buffer
)

// buildAll builds what is missing of the control plane, and always devmgr.
func buildAll() error {
	wd, err := os.Getwd()
	if err != nil {
		return err
	}
	if binDir, err = cluster.CacheDir(); err != nil {
		return err
	}
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return err
	}
	if devmgrDir, err = os.MkdirTemp("", "e2e-devmgr"); err != nil {
		return err
	}
	var builds []cluster.Build
	if bins, builds, err = cluster.ControlPlane(binDir); err != nil {
		return err
	}
	devmgrBin = filepath.Join(devmgrDir, "devmgr")
	builds = append(builds, cluster.Build{Dir: filepath.Dir(wd), Pkg: "./cmd/devmgr", Out: devmgrBin, Always: true})
	return cluster.BuildAll(&buildLog, builds...)
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

func TestComponentsAreCachedOutsideTheRepository(t *testing.T) {
	xdg := filepath.Join(os.TempDir(), "xdg-cache")
	t.Setenv("XDG_CACHE_HOME", xdg)
	t.Setenv(cluster.CacheEnv, "")
	dir, err := cluster.CacheDir()
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(xdg, "devmgr", "e2e"); dir != want {
		t.Fatalf("cache directory %s, want %s", dir, want)
	}
	t.Setenv(cluster.CacheEnv, "elsewhere")
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	if dir, err = cluster.CacheDir(); err != nil || dir != filepath.Join(wd, "elsewhere") {
		t.Fatalf("with %s=elsewhere: cache directory %s (%v), want %s", cluster.CacheEnv, dir, err, filepath.Join(wd, "elsewhere"))
	}
}

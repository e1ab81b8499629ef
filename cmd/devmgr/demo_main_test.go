package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// devmgrBinary is the devmgr command built once by TestMain, for the tests
// that run it end to end. It is built with the race detector when the tests
// are, so that a race in a command fails its run (exit code 66).
var devmgrBinary string

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "devmgr-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, "create a directory for the devmgr binary:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	devmgrBinary = filepath.Join(dir, "devmgr")
	args := []string{"build", "-o", devmgrBinary}
	if raceEnabled {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, ".")...)
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build devmgr: %v\n%s", err, out)
		return 1
	}
	// The client commands read it when --control-socket is absent; the
	// tests that want it set it themselves.
	_ = os.Unsetenv(envControlSocket)
	if _, set := os.LookupEnv("GORACE"); !set {
		// The race runtime sleeps a second at exit, for goroutines still
		// running to report; the commands stop theirs before exiting.
		_ = os.Setenv("GORACE", "atexit_sleep_ms=0")
	}
	return m.Run()
}

// binaryResult is the outcome of one run of the devmgr binary.
type binaryResult struct {
	stdout, stderr string
	exitCode       int
}

// runDevmgrBinary runs the devmgr binary with args and extra environment
// variables (KEY=value), and waits for it, up to a minute.
func runDevmgrBinary(t *testing.T, env []string, args ...string) binaryResult {
	t.Helper()
	return runDevmgrBinaryIn(t, "", env, args...)
}

// runDevmgrBinaryIn is runDevmgrBinary in the working directory dir ("":
// the test's).
func runDevmgrBinaryIn(t *testing.T, dir string, env []string, args ...string) binaryResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, devmgrBinary, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := binaryResult{stdout: stdout.String(), stderr: stderr.String()}
	var exitErr *exec.ExitError
	switch {
	case errors.As(err, &exitErr):
		res.exitCode = exitErr.ExitCode()
	case err != nil:
		t.Fatalf("run devmgr %v: %v", args, err)
	}
	if ctx.Err() != nil {
		t.Fatalf("devmgr %v did not exit within a minute; stderr:\n%s", args, res.stderr)
	}
	return res
}

// A reader that goes away (devmgr demo -v 3 2>&1 | head -1) ends the demo,
// which still stops what it started and removes its directory.
func TestDemoCleansUpWhenItsReaderGoes(t *testing.T) {
	tmp := shortTempDir(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	_ = r.Close() // every write to w now fails: EPIPE, or SIGPIPE
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, devmgrBinary, "demo", "-vv")
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	cmd.Stdout, cmd.Stderr = w, w
	err = cmd.Run()
	_ = w.Close()
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		t.Fatal(err)
	}
	left, err := os.ReadDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range left {
		t.Errorf("left behind in TMPDIR: %s", e.Name())
	}
}

// A demo cut short by --timeout says so.
func TestDemoSaysItTimedOut(t *testing.T) {
	res := runDevmgrBinary(t, nil, "demo", "--timeout", "1ms")
	if res.exitCode != 1 || !strings.Contains(res.stderr, "demo timed out after 1ms (--timeout)") {
		t.Errorf("--timeout 1ms: exit %d, stderr %q", res.exitCode, res.stderr)
	}
}

// The manager's log lines carry its name once.
func TestDemoLogNamesTheManagerOnce(t *testing.T) {
	res := runDevmgrBinary(t, nil, "demo", "-v", "2")
	if res.exitCode != 0 {
		t.Fatalf("exit %d: %s", res.exitCode, res.stderr)
	}
	if !strings.Contains(res.stderr, `logger="devicemanager"`) || strings.Contains(res.stderr, "devicemanager.devicemanager") {
		t.Errorf("want the manager's lines under logger=\"devicemanager\", once:\n%s", res.stderr)
	}
}

//go:build reliability

package reliability

// LazyFS: a FUSE file system that keeps what is written to it in its own
// cache until the file is fsynced, and drops every unsynced byte when told
// to. Dropping the cache after a SIGKILL is what a power cut does to a file
// system: whatever the process wrote and did not sync is gone. LazyFS passes
// metadata operations (create, rename, unlink) to the disk below at once, so
// it cannot show a missing fsync of a directory; it can show a rename of a
// file whose data was never synced, which then reads empty or short.
//
// The power-loss tests need the binary: -lazyfs PATH (make reliability
// LAZYFS=PATH). Its shared library, libpcache.so, must be beside it.

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var lazyfsPath = flag.String("lazyfs", "", "path of the LazyFS binary (libpcache.so beside it) the power-loss tests mount; without it they fail")

// Commands and answers of LazyFS's control FIFOs.
const (
	lazyfsClearCache = "lazyfs::clear-cache"
	lazyfsCleared    = "finished::clear-cache"
)

// lazyFS is a mounted LazyFS. mnt is the mount point; disk is the directory
// below it, what a disk holds.
type lazyFS struct {
	mnt, disk string
	logPath   string
	cmd       *exec.Cmd
	exited    chan struct{} // closed once the process is reaped
	// commands and completed are LazyFS's two FIFOs, both opened read-write
	// here: a write never blocks for want of a reader, a read never sees
	// end-of-file while LazyFS starts or stops, and a read has a deadline.
	commands, completed *os.File
	answers             *bufio.Reader
}

// noLazyFS says why a power-loss category did not run, and how to run it.
const noLazyFS = "skipped: no LazyFS (a FUSE file system that drops unsynced data on command), which the power-loss " +
	"categories mount; build it as .ci/run does and pass the binary's path: " +
	"make reliability LAZYFS=PATH, or go test -tags reliability ./reliability/ -args -lazyfs PATH"

// needLazyFS returns the LazyFS binary -lazyfs names. Without one, the test
// of category is skipped, and recorded as skipped, unless -require-lazyfs
// is set: then it fails.
func needLazyFS(t *testing.T, category string) string {
	t.Helper()
	if *lazyfsPath == "" {
		if *requireLazyFS {
			require.FailNow(t, "no LazyFS, and -require-lazyfs is set", noLazyFS)
		}
		record(t, Figures{Category: category, Skipped: noLazyFS})
		t.Skip(noLazyFS)
	}
	fi, err := os.Stat(*lazyfsPath)
	require.NoError(t, err, "-lazyfs")
	require.True(t, fi.Mode().IsRegular() && fi.Mode()&0o111 != 0, "-lazyfs %s is not an executable file", *lazyfsPath)
	return *lazyfsPath
}

// mountLazyFS mounts LazyFS on a new short directory, shows that it loses
// unsynced data (selfCheck), and unmounts it when the test ends, however it
// ends. If the test process itself dies, LazyFS dies with it (Pdeathsig) and
// fusermount3 unmounts (auto_unmount).
func mountLazyFS(t *testing.T, category string) *lazyFS {
	t.Helper()
	bin := needLazyFS(t, category)
	base := shortDir(t)
	l := &lazyFS{
		mnt:     filepath.Join(base, "mnt"),
		disk:    filepath.Join(base, "disk"),
		logPath: filepath.Join(base, "lazyfs.log"),
		exited:  make(chan struct{}),
	}
	cmdFifo, doneFifo := filepath.Join(base, "cmd"), filepath.Join(base, "done")
	for _, d := range []string{l.mnt, l.disk} {
		require.NoError(t, os.Mkdir(d, 0o755))
	}
	for _, f := range []string{cmdFifo, doneFifo} {
		require.NoError(t, syscall.Mkfifo(f, 0o600))
	}
	conf := filepath.Join(base, "lazyfs.toml")
	require.NoError(t, os.WriteFile(conf, []byte(fmt.Sprintf(`[faults]
fifo_path=%q
fifo_path_completed=%q
[cache]
apply_eviction=false
[cache.simple]
custom_size="16mb"
blocks_per_page=1
[filesystem]
log_all_operations=false
logfile=%q
`, cmdFifo, doneFifo, filepath.Join(base, "ops.log"))), 0o600))
	var err error
	l.commands, err = os.OpenFile(cmdFifo, os.O_RDWR, 0)
	require.NoError(t, err)
	l.completed, err = os.OpenFile(doneFifo, os.O_RDWR, 0)
	require.NoError(t, err)
	l.answers = bufio.NewReader(l.completed)
	out, err := os.Create(l.logPath)
	require.NoError(t, err)
	defer out.Close()

	// One -o: LazyFS passes at most ten arguments on to FUSE and drops the
	// rest, "-f" (foreground) among them if it comes late.
	l.cmd = exec.Command(bin, l.mnt, "--config-path", conf,
		"-o", "allow_other,auto_unmount,modules=subdir,subdir="+l.disk, "-f")
	l.cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+filepath.Dir(bin))
	l.cmd.Stdout, l.cmd.Stderr = out, out
	l.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, l.cmd.Start(), "start LazyFS")
	go func() {
		_ = l.cmd.Wait()
		close(l.exited)
	}()
	t.Cleanup(func() {
		if err := l.unmount(); err != nil {
			t.Errorf("LazyFS on %s: %v\n%s", l.mnt, err, l.log())
		}
	})
	err = pollUntil(waitLimit, func() bool {
		select {
		case <-l.exited:
			return true
		default:
		}
		return isMounted(l.mnt)
	})
	require.NoError(t, err, "LazyFS did not mount %s\n%s", l.mnt, l.log())
	select {
	case <-l.exited:
		require.FailNow(t, "LazyFS exited at start", "%s", l.log())
	default:
	}
	l.selfCheck(t)
	return l
}

// powerLoss drops every byte written to the mount and not synced, and
// returns once LazyFS reports it done.
func (l *lazyFS) powerLoss() error {
	if _, err := l.commands.WriteString(lazyfsClearCache + "\n"); err != nil {
		return fmt.Errorf("send %s: %w", lazyfsClearCache, err)
	}
	if err := l.completed.SetReadDeadline(time.Now().Add(waitLimit)); err != nil {
		return err
	}
	line, err := l.answers.ReadString('\n')
	if err != nil {
		return fmt.Errorf("LazyFS did not report %s within %v: %w\n%s", lazyfsClearCache, waitLimit, err, l.log())
	}
	if got := strings.TrimSpace(line); got != lazyfsCleared {
		return fmt.Errorf("LazyFS answered %q to %s, want %q", got, lazyfsClearCache, lazyfsCleared)
	}
	return nil
}

// unmount unmounts with fusermount3 -u, waits for LazyFS to exit, kills it
// if it does not, and makes sure no mount is left, lazily unmounting one
// that is. It reports what went wrong; nothing is left behind either way.
func (l *lazyFS) unmount() error {
	var errs []error
	if isMounted(l.mnt) {
		if out, err := exec.Command("fusermount3", "-u", l.mnt).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("fusermount3 -u: %w: %s", err, out))
		}
	}
	timer := time.NewTimer(waitLimit)
	defer timer.Stop()
	select {
	case <-l.exited:
	case <-timer.C:
		_ = l.cmd.Process.Kill()
		<-l.exited
		errs = append(errs, fmt.Errorf("LazyFS still ran %v after the unmount; killed", waitLimit))
	}
	if isMounted(l.mnt) {
		out, err := exec.Command("fusermount3", "-u", "-z", l.mnt).CombinedOutput()
		errs = append(errs, fmt.Errorf("still mounted after LazyFS exited; fusermount3 -u -z: %s", out), err)
	}
	errs = append(errs, l.commands.Close(), l.completed.Close())
	return errors.Join(errs...)
}

// log returns the end of LazyFS's output.
func (l *lazyFS) log() string {
	b, _ := os.ReadFile(l.logPath)
	return "LazyFS output:\n" + string(b[max(0, len(b)-8<<10):])
}

// isMounted reports whether a file system is mounted on dir, from this
// process's mount table.
func isMounted(dir string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		// Field 5 is the mount point (octal escapes for spaces and the
		// like; the test's paths have none).
		if f := strings.Fields(line); len(f) > 4 && f[4] == dir {
			return true
		}
	}
	return false
}

// selfCheck shows that the mount drops unsynced data: a file written,
// renamed without a sync, and then a power loss must read empty; a synced
// one must survive. Without this, a mount that kept everything would pass
// every power-loss test.
func (l *lazyFS) selfCheck(t *testing.T) {
	t.Helper()
	synced, unsynced := filepath.Join(l.mnt, "synced"), filepath.Join(l.mnt, "unsynced")
	write := func(path string, sync bool) {
		tmp := path + ".tmp"
		f, err := os.Create(tmp)
		require.NoError(t, err)
		_, err = f.WriteString("payload")
		require.NoError(t, err)
		if sync {
			require.NoError(t, f.Sync())
		}
		require.NoError(t, f.Close())
		require.NoError(t, os.Rename(tmp, path))
	}
	write(synced, true)
	write(unsynced, false)
	require.NoError(t, l.powerLoss())
	got, err := os.ReadFile(synced)
	require.NoError(t, err)
	require.Equal(t, "payload", string(got), "LazyFS lost synced data")
	got, err = os.ReadFile(unsynced)
	require.NoError(t, err)
	require.Empty(t, got, "LazyFS kept unsynced data across a power loss: it cannot test what it must")
	require.NoError(t, errors.Join(os.Remove(synced), os.Remove(unsynced)))
}

// lossCounts are the temporary files the crash categories find in the
// checkpoint directory: right after a kill (before anything else), after the
// power loss that follows it, and after the next Start (which must remove
// them); and the power losses LazyFS reported done.
type lossCounts struct {
	losses                                       int
	tempAfterKill, tempAfterLoss, tempAfterStart int
	maxTempAfterKill, maxTempAfterLoss           int
}

// afterKill counts, with count, the temporary files kill k left; on lz it
// then drops the unsynced data and counts again. LazyFS applies creations at
// once, so the power loss must remove none.
func (c *lossCounts) afterKill(t *testing.T, k int, lz *lazyFS, count func(event string, total, most *int) int) {
	t.Helper()
	temps := count("the kill", &c.tempAfterKill, &c.maxTempAfterKill)
	if lz == nil {
		return
	}
	require.NoError(t, lz.powerLoss(), "power loss after kill %d", k)
	c.losses++
	if after := count("the power loss", &c.tempAfterLoss, &c.maxTempAfterLoss); after != temps {
		t.Errorf("kill %d: %d temporary files after the kill, %d after the power loss: LazyFS applies creations at once", k, temps, after)
	}
}

// recordLosses records the power-loss figures of kills kills; mostName names
// the largest count after one loss.
func (c *lossCounts) recordLosses(t *testing.T, fig *Figures, kills int, mostName string) {
	t.Helper()
	fig.Faults = c.losses
	fig.exact(t, "power losses (LazyFS reported the unsynced data dropped)", c.losses, kills)
	fig.exact(t, "temporary files found right after a power loss (total)", c.tempAfterLoss, c.tempAfterKill)
	fig.atMost(t, mostName, c.maxTempAfterLoss, 1)
}

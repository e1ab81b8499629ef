package checkpoint

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func newTestStore(t *testing.T) (*fileStore, string) {
	t.Helper()
	dir := t.TempDir()
	m, err := NewManager(dir)
	require.NoError(t, err)
	return m.(*fileStore), dir
}

// dirNames lists every name in dir, sorted.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

func TestNewManagerRejectsEmptyDir(t *testing.T) {
	_, err := NewManager("")
	assert.Error(t, err)
}

func TestStoreRoundTrip(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "device-plugins")
	m, err := NewManager(dir)
	require.NoError(t, err)
	_, err = os.Stat(dir)
	require.ErrorIs(t, err, fs.ErrNotExist, "NewManager touches no files")

	keys, err := m.ListCheckpoints()
	require.NoError(t, err)
	assert.Empty(t, keys, "a missing directory lists nothing")
	require.ErrorIs(t, m.GetCheckpoint(DeviceManagerKey, New(nil, nil)), ErrNotFound)

	require.NoError(t, m.CreateCheckpoint(DeviceManagerKey, New(sampleEntries(), sampleRegistered())))

	info, err := os.Stat(dir)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o755), info.Mode().Perm())
	info, err = os.Stat(filepath.Join(dir, DeviceManagerKey))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	onDisk, err := os.ReadFile(filepath.Join(dir, DeviceManagerKey))
	require.NoError(t, err)
	assert.Equal(t, string(readFixture(t, "sample", DeviceManagerKey)), string(onDisk))

	got := New(nil, nil)
	require.NoError(t, m.GetCheckpoint(DeviceManagerKey, got))
	entries, registered := got.GetData()
	assert.Equal(t, sampleEntries(), entries)
	assert.Equal(t, sampleRegistered(), registered)
	assert.Equal(t, []string{DeviceManagerKey}, dirNames(t, dir))
}

// Every write is a new file renamed over the checkpoint (a new inode, mode
// 0600), never a rewrite of an existing file, and leaves no other file.
func TestEveryWriteReplacesTheFile(t *testing.T) {
	s, dir := newTestStore(t)
	ck := filepath.Join(dir, DeviceManagerKey)
	var inodes []uint64
	for i := range 5 {
		e := sampleEntries()
		e[0].PodUID = fmt.Sprintf("pod-%d", i%2) // the same content comes back: still written
		require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, New(e, sampleRegistered())))
		info, err := os.Lstat(ck)
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o600), info.Mode())
		inodes = append(inodes, info.Sys().(*syscall.Stat_t).Ino)
		got := New(nil, nil)
		require.NoError(t, s.GetCheckpoint(DeviceManagerKey, got))
		entries, _ := got.GetData()
		assert.Equal(t, e, entries)
		assert.Equal(t, []string{DeviceManagerKey}, dirNames(t, dir), "write %d leaves no other file", i)
	}
	assert.Len(t, slices.Compact(slices.Clone(inodes)), len(inodes), "each write is a new file: %v", inodes)
}

// recordingFS records the steps of writes in order.
type recordingFS struct {
	osFileSystem
	steps []string
}

func (r *recordingFS) CreateTemp(dir, pattern string) (tempFile, error) {
	f, err := r.osFileSystem.CreateTemp(dir, pattern)
	if err != nil {
		return nil, err
	}
	r.steps = append(r.steps, "create "+filepath.Base(f.Name()))
	return &recordingFile{tempFile: f, fs: r}, nil
}

func (r *recordingFS) Rename(from, to string) error {
	r.steps = append(r.steps, "rename "+filepath.Base(from)+" "+filepath.Base(to))
	return r.osFileSystem.Rename(from, to)
}

func (r *recordingFS) SyncDir(dir string) error {
	r.steps = append(r.steps, "syncdir")
	return r.osFileSystem.SyncDir(dir)
}

type recordingFile struct {
	tempFile
	fs *recordingFS
}

func (f *recordingFile) Write(b []byte) (int, error) {
	f.fs.steps = append(f.fs.steps, fmt.Sprintf("write %d", len(b)))
	return f.tempFile.Write(b)
}

func (f *recordingFile) Sync() error {
	f.fs.steps = append(f.fs.steps, "sync")
	return f.tempFile.Sync()
}

func (f *recordingFile) Close() error {
	f.fs.steps = append(f.fs.steps, "close")
	return f.tempFile.Close()
}

// A write is the textbook durable write, whole, every time: a temporary file
// starting with ".", the whole document written, fsync, close, rename over
// the checkpoint, fsync of the directory.
func TestWriteIsTheDurableSequence(t *testing.T) {
	s, _ := newTestStore(t)
	rec := &recordingFS{}
	s.fs = rec
	doc := New(sampleEntries(), sampleRegistered())
	blob, err := doc.MarshalCheckpoint()
	require.NoError(t, err)
	for range 2 {
		rec.steps = nil
		require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, doc))
		require.Len(t, rec.steps, 6, "%q", rec.steps)
		tmp := strings.TrimPrefix(rec.steps[0], "create ")
		assert.True(t, strings.HasPrefix(tmp, ".") && strings.Trim(tmp[1:], "0123456789") == "", "temporary name %q", tmp)
		assert.Equal(t, []string{
			"create " + tmp, fmt.Sprintf("write %d", len(blob)), "sync", "close",
			"rename " + tmp + " " + DeviceManagerKey, "syncdir",
		}, rec.steps)
	}
}

func TestStoreList(t *testing.T) {
	s, dir := newTestStore(t)
	require.NoError(t, s.CreateCheckpoint("id2", New(nil, nil)))
	require.NoError(t, s.CreateCheckpoint("id1", New(nil, nil)))
	require.NoError(t, os.WriteFile(filepath.Join(dir, ".123456"), nil, 0o600))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "subdir"), 0o755))
	l, err := net.Listen("unix", filepath.Join(dir, "plugin.sock"))
	require.NoError(t, err)
	defer l.Close()

	keys, err := s.ListCheckpoints()
	require.NoError(t, err)
	assert.Equal(t, []string{"id1", "id2", "plugin.sock", "subdir"}, keys)

	require.NoError(t, s.RemoveCheckpoint("id1"))
	require.NoError(t, s.RemoveCheckpoint("id1"), "removing a missing key is not an error")
	require.ErrorIs(t, s.GetCheckpoint("id1", New(nil, nil)), ErrNotFound)
	keys, err = s.ListCheckpoints()
	require.NoError(t, err)
	assert.Equal(t, []string{"id2", "plugin.sock", "subdir"}, keys)
}

func TestStoreListErrorIsReported(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "not-a-dir")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	m, err := NewManager(file)
	require.NoError(t, err)
	_, err = m.ListCheckpoints()
	assert.Error(t, err)
}

func TestKeyValidation(t *testing.T) {
	long := strings.Repeat("a", maxKeyLength)
	for _, key := range []string{"id1", "a7.87-6_8", "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "a", long, DeviceManagerKey} {
		assert.NoError(t, ValidateKey(key), key)
	}
	s, _ := newTestStore(t)
	for _, key := range []string{"", "    ", "/foo/bar", "/id1", ".id1", "___", "a7.87-677-", "-a", "a/b", "..", "a\x00b", long + "a", "é"} {
		t.Run(key, func(t *testing.T) {
			err := ValidateKey(key)
			var ke *KeyError
			require.ErrorAs(t, err, &ke)
			assert.EqualError(t, err, `invalid key: "`+strings.ReplaceAll(strings.ReplaceAll(key, `\`, `\\`), "\x00", `\x00`)+`"`)
			assert.ErrorAs(t, s.CreateCheckpoint(key, New(nil, nil)), &ke)
			assert.ErrorAs(t, s.GetCheckpoint(key, New(nil, nil)), &ke)
			assert.ErrorAs(t, s.RemoveCheckpoint(key), &ke)
		})
	}
}

func TestGetCheckpointReadError(t *testing.T) {
	s, dir := newTestStore(t)
	require.NoError(t, os.Mkdir(filepath.Join(dir, "adir"), 0o755))
	err := s.GetCheckpoint("adir", New(nil, nil))
	require.Error(t, err)
	assert.NotErrorIs(t, err, ErrNotFound)
}

// A write over a directory fails, as in the kubelet's store, and leaves the
// directory and no temporary file.
func TestWriteOverADirectoryFails(t *testing.T) {
	s, dir := newTestStore(t)
	require.NoError(t, os.Mkdir(filepath.Join(dir, DeviceManagerKey), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, DeviceManagerKey, "inside"), nil, 0o600))
	require.Error(t, s.CreateCheckpoint(DeviceManagerKey, New(nil, nil)))
	assert.Equal(t, []string{DeviceManagerKey}, dirNames(t, dir))
}

// faultyFS wraps the real file system and fails some steps of a write.
type faultyFS struct {
	osFileSystem
	// failAt names the failing steps: "mkdir", "create", "write", "sync",
	// "close", "rename", "syncdir", "remove".
	failAt []string
	err    error
}

func (f *faultyFS) fail(step string) error {
	if slices.Contains(f.failAt, step) {
		return f.err
	}
	return nil
}

func (f *faultyFS) MkdirAll(dir string, perm os.FileMode) error {
	if err := f.fail("mkdir"); err != nil {
		return err
	}
	return f.osFileSystem.MkdirAll(dir, perm)
}

func (f *faultyFS) CreateTemp(dir, pattern string) (tempFile, error) {
	if err := f.fail("create"); err != nil {
		return nil, err
	}
	file, err := f.osFileSystem.CreateTemp(dir, pattern)
	if err != nil {
		return nil, err
	}
	return &faultyFile{tempFile: file, fs: f}, nil
}

func (f *faultyFS) Rename(from, to string) error {
	if err := f.fail("rename"); err != nil {
		return err
	}
	return f.osFileSystem.Rename(from, to)
}

func (f *faultyFS) SyncDir(dir string) error {
	if err := f.fail("syncdir"); err != nil {
		return err
	}
	return f.osFileSystem.SyncDir(dir)
}

func (f *faultyFS) Remove(name string) error {
	if err := f.fail("remove"); err != nil {
		return err
	}
	return f.osFileSystem.Remove(name)
}

type faultyFile struct {
	tempFile
	fs *faultyFS
}

func (f *faultyFile) Write(b []byte) (int, error) {
	if err := f.fs.fail("write"); err != nil {
		n, _ := f.tempFile.Write(b[:len(b)/2])
		return n, err
	}
	return f.tempFile.Write(b)
}

func (f *faultyFile) Sync() error {
	if err := f.fs.fail("sync"); err != nil {
		return err
	}
	return f.tempFile.Sync()
}

func (f *faultyFile) Close() error {
	if err := f.fs.fail("close"); err != nil {
		_ = f.tempFile.Close()
		return err
	}
	return f.tempFile.Close()
}

// A write that fails at any step returns the error and leaves a readable
// checkpoint and no other file: the previous content when it failed before
// the rename, the new one when only the directory sync after it failed.
func TestWriteFailureAtEachStep(t *testing.T) {
	oldEntries := sampleEntries()
	newEntries := []PodDevicesEntry{{PodUID: "pod-2", ContainerName: "c", ResourceName: "example.com/dev",
		DeviceIDs: DevicesPerNUMA{1: {"dev-9"}}, AllocResp: []byte{}}}
	injected := errors.New("injected failure")
	for _, step := range []string{"mkdir", "create", "write", "sync", "close", "rename", "syncdir"} {
		t.Run(step, func(t *testing.T) {
			s, dir := newTestStore(t)
			require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, New(oldEntries, sampleRegistered())))

			s.fs = &faultyFS{failAt: []string{step}, err: injected}
			err := s.CreateCheckpoint(DeviceManagerKey, New(newEntries, map[string][]string{}))
			require.ErrorIs(t, err, injected)

			s.fs = osFileSystem{}
			got := New(nil, nil)
			require.NoError(t, s.GetCheckpoint(DeviceManagerKey, got), "the checkpoint stays readable")
			entries, _ := got.GetData()
			if step == "syncdir" {
				assert.Equal(t, newEntries, entries)
			} else {
				assert.Equal(t, oldEntries, entries)
			}
			assert.Equal(t, []string{DeviceManagerKey}, dirNames(t, dir), "no other file is left")
		})
	}
}

// When even the clean-up of the temporary file fails, both errors are reported.
func TestWriteFailureAndCleanupFailure(t *testing.T) {
	s, _ := newTestStore(t)
	writeErr := errors.New("disk full")
	s.fs = &faultyFS{failAt: []string{"write", "remove"}, err: writeErr}
	err := s.CreateCheckpoint(DeviceManagerKey, New(nil, nil))
	assert.ErrorIs(t, err, writeErr)
	assert.ErrorContains(t, err, "write checkpoint")
	var joined interface{ Unwrap() []error }
	require.ErrorAs(t, err, &joined)
	assert.Len(t, joined.Unwrap(), 2, "the write error and the clean-up error: %v", err)
}

type failingCheckpoint struct{ Data }

func (failingCheckpoint) MarshalCheckpoint() ([]byte, error) { return nil, errors.New("boom") }

func TestCreateCheckpointMarshalError(t *testing.T) {
	s, dir := newTestStore(t)
	err := s.CreateCheckpoint(DeviceManagerKey, &failingCheckpoint{})
	assert.ErrorContains(t, err, "boom")
	assert.Empty(t, dirNames(t, dir))
}

func TestRemoveError(t *testing.T) {
	s, _ := newTestStore(t)
	s.fs = &faultyFS{failAt: []string{"remove"}, err: fs.ErrPermission}
	assert.ErrorIs(t, s.RemoveCheckpoint("key"), fs.ErrPermission)
}

func TestSyncDirOfMissingDir(t *testing.T) {
	assert.Error(t, osFileSystem{}.SyncDir(filepath.Join(t.TempDir(), "missing")))
}

// A FIFO in the checkpoint's place is refused at once (reading it would
// block forever), as a file that does not decode.
func TestGetCheckpointRefusesNonRegularFile(t *testing.T) {
	s, dir := newTestStore(t)
	require.NoError(t, syscall.Mkfifo(filepath.Join(dir, DeviceManagerKey), 0o600))
	err := s.GetCheckpoint(DeviceManagerKey, New(nil, nil))
	var de *DecodeError
	require.ErrorAs(t, err, &de)
	assert.Contains(t, err.Error(), "is not a regular file")
}

func TestRemoveTempFiles(t *testing.T) {
	s, dir := newTestStore(t)
	require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, New(nil, nil)))
	for _, name := range []string{".123", ".4567", ".abc", ".1x", "123"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), nil, 0o600))
	}
	require.NoError(t, os.Mkdir(filepath.Join(dir, ".890"), 0o755))
	n, err := RemoveTempFiles(dir)
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	assert.Equal(t, []string{".1x", ".890", ".abc", "123", DeviceManagerKey}, dirNames(t, dir))

	n, err = RemoveTempFiles(filepath.Join(dir, "missing"))
	require.NoError(t, err)
	assert.Zero(t, n)
	_, err = RemoveTempFiles(filepath.Join(dir, "123"))
	assert.Error(t, err, "not a directory")
}

// A reader that opened the checkpoint keeps reading what it opened, however
// many writes follow: a write never changes an existing file.
func TestReaderOfOldCheckpointIsNotOverwritten(t *testing.T) {
	s, dir := newTestStore(t)
	blobs := make([][]byte, 4)
	docs := make([]Checkpoint, 4)
	for i := range docs {
		e := sampleEntries()
		e[0].PodUID = fmt.Sprintf("pod-%d-%s", i, strings.Repeat("x", 1000*i))
		docs[i] = New(e, sampleRegistered())
		var err error
		blobs[i], err = docs[i].MarshalCheckpoint()
		require.NoError(t, err)
	}
	ck := filepath.Join(dir, DeviceManagerKey)
	require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, docs[0]))
	require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, docs[1]))
	reader, err := os.Open(ck)
	require.NoError(t, err)
	defer reader.Close()
	require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, docs[2]))
	require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, docs[3]))

	got, err := io.ReadAll(reader)
	require.NoError(t, err)
	assert.Equal(t, string(blobs[1]), string(got), "the reader's file was written over")
	onDisk, err := os.ReadFile(ck)
	require.NoError(t, err)
	assert.Equal(t, string(blobs[3]), string(onDisk))
	assert.Equal(t, []string{DeviceManagerKey}, dirNames(t, dir))
}

// Two stores writing the same directory at once, and a reader reading
// throughout: every read decodes and verifies (never a mix of two writes),
// every write reports success, and the checkpoint ends as one store's last
// write, with no other file left.
func TestTwoStoresAndAReader(t *testing.T) {
	dir := t.TempDir()
	stores := make([]Manager, 2)
	for i := range stores {
		var err error
		stores[i], err = NewManager(dir)
		require.NoError(t, err)
	}
	const writes = 150
	doc := func(store, i int) *Data {
		e := sampleEntries()
		e[0].PodUID = fmt.Sprintf("store-%d-write-%d-%s", store, i, strings.Repeat("y", (i*37)%3000))
		return New(e, sampleRegistered())
	}
	done := make(chan struct{})
	readErr := make(chan error, 1)
	go func() {
		defer close(readErr)
		reads := 0
		for {
			select {
			case <-done:
				if reads == 0 {
					readErr <- errors.New("the reader never read")
				}
				return
			default:
			}
			blob, err := os.ReadFile(filepath.Join(dir, DeviceManagerKey))
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err == nil {
				c := New(nil, nil)
				if err = c.UnmarshalCheckpoint(blob); err == nil {
					err = c.VerifyChecksum()
				}
			}
			if err != nil {
				readErr <- fmt.Errorf("read %d: %w", reads, err)
				return
			}
			reads++
		}
	}()
	var wg sync.WaitGroup
	errs := make([]error, len(stores))
	for si, st := range stores {
		wg.Go(func() {
			for i := range writes {
				if err := st.CreateCheckpoint(DeviceManagerKey, doc(si, i)); err != nil {
					errs[si] = err
					return
				}
			}
		})
	}
	wg.Wait()
	close(done)
	require.NoError(t, <-readErr)
	for _, err := range errs {
		require.NoError(t, err)
	}
	got := New(nil, nil)
	require.NoError(t, stores[0].GetCheckpoint(DeviceManagerKey, got))
	entries, _ := got.GetData()
	last0, _ := doc(0, writes-1).GetData()
	last1, _ := doc(1, writes-1).GetData()
	assert.Contains(t, []string{last0[0].PodUID, last1[0].PodUID}, entries[0].PodUID, "the checkpoint is not a last write")
	assert.Equal(t, []string{DeviceManagerKey}, dirNames(t, dir))
}

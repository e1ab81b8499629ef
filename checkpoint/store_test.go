package checkpoint

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
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

func dotFiles(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			out = append(out, e.Name())
		}
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
	assert.Empty(t, dotFiles(t, dir))
}

// Listing follows the kubelet: every name not starting with "." counts,
// whatever it is (that is what makes ShouldResetExtendedResourceCapacity false
// while a plugin socket exists).
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

// faultyFS wraps the real file system and fails one step of a write.
type faultyFS struct {
	osFileSystem
	failAt string // "mkdir", "create", "write", "sync", "close", "rename", "syncdir", "remove"
	err    error
}

func (f *faultyFS) fail(step string) error {
	if f.failAt == step {
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

// A write that fails at any step leaves a readable checkpoint (the old content
// before the rename, the new one after it) and no temporary file.
func TestWriteFailureAtEachStep(t *testing.T) {
	oldEntries := sampleEntries()
	newEntries := []PodDevicesEntry{{PodUID: "pod-2", ContainerName: "c", ResourceName: "example.com/dev",
		DeviceIDs: DevicesPerNUMA{1: {"dev-9"}}, AllocResp: []byte{}}}
	injected := errors.New("injected failure")
	tests := []struct {
		step    string
		wantNew bool // the rename happened before the failure
	}{
		{step: "mkdir"}, {step: "create"}, {step: "write"}, {step: "sync"}, {step: "close"}, {step: "rename"},
		{step: "syncdir", wantNew: true},
	}
	for _, tc := range tests {
		t.Run(tc.step, func(t *testing.T) {
			s, dir := newTestStore(t)
			require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, New(oldEntries, sampleRegistered())))

			f := &faultyFS{failAt: tc.step, err: injected}
			s.fs = f
			err := s.CreateCheckpoint(DeviceManagerKey, New(newEntries, map[string][]string{}))
			require.ErrorIs(t, err, injected)

			s.fs = osFileSystem{}
			got := New(nil, nil)
			require.NoError(t, s.GetCheckpoint(DeviceManagerKey, got), "the checkpoint stays readable")
			entries, _ := got.GetData()
			if tc.wantNew {
				assert.Equal(t, newEntries, entries)
			} else {
				assert.Equal(t, oldEntries, entries)
			}
			assert.Empty(t, dotFiles(t, dir), "no temporary file is left behind")
			keys, err := s.ListCheckpoints()
			require.NoError(t, err)
			assert.Equal(t, []string{DeviceManagerKey}, keys)
		})
	}
}

// When even the clean-up of the temporary file fails, both errors are reported.
func TestWriteFailureAndCleanupFailure(t *testing.T) {
	s, _ := newTestStore(t)
	writeErr := errors.New("disk full")
	f := &faultyFS{failAt: "write", err: writeErr}
	s.fs = &removeFails{faultyFS: f}
	err := s.CreateCheckpoint(DeviceManagerKey, New(nil, nil))
	assert.ErrorIs(t, err, writeErr)
	assert.ErrorContains(t, err, "cannot remove")
}

type removeFails struct{ *faultyFS }

func (removeFails) Remove(string) error { return errors.New("cannot remove") }

type failingCheckpoint struct{ Data }

func (failingCheckpoint) MarshalCheckpoint() ([]byte, error) { return nil, errors.New("boom") }

func TestCreateCheckpointMarshalError(t *testing.T) {
	s, dir := newTestStore(t)
	err := s.CreateCheckpoint(DeviceManagerKey, &failingCheckpoint{})
	assert.ErrorContains(t, err, "boom")
	assert.Empty(t, dotFiles(t, dir))
}

func TestRemoveError(t *testing.T) {
	s, _ := newTestStore(t)
	s.fs = &faultyFS{failAt: "remove", err: fs.ErrPermission}
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
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	assert.Equal(t, []string{".1x", ".890", ".abc", "123", DeviceManagerKey}, names)

	n, err = RemoveTempFiles(filepath.Join(dir, "missing"))
	require.NoError(t, err)
	assert.Zero(t, n)
	_, err = RemoveTempFiles(filepath.Join(dir, "123"))
	assert.Error(t, err, "not a directory")
}

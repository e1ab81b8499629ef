package checkpoint

import (
	"bytes"
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

// faultyFS wraps the real file system and fails some steps of a write.
type faultyFS struct {
	osFileSystem
	// failAt names the failing steps: "mkdir", "spare" (opening it),
	// "create", "write", "truncate", "sync", "close", "lstat", "exchange",
	// "rename", "syncdir", "remove", "read" (of a spare's content).
	failAt []string
	err    error
	// writes records the offset of every WriteAt, syncs counts the syncs
	// of files written to.
	writes []int64
	syncs  int
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

func (f *faultyFS) OpenSpare(name string) (tempFile, error) {
	if err := f.fail("spare"); err != nil {
		return nil, err
	}
	file, err := f.osFileSystem.OpenSpare(name)
	if err != nil {
		return nil, err
	}
	return &faultyFile{tempFile: file, fs: f}, nil
}

func (f *faultyFS) Lstat(name string) (fs.FileInfo, error) {
	if err := f.fail("lstat"); err != nil {
		return nil, err
	}
	return f.osFileSystem.Lstat(name)
}

func (f *faultyFS) Exchange(a, b string) error {
	if err := f.fail("exchange"); err != nil {
		return err
	}
	return f.osFileSystem.Exchange(a, b)
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

func (f *faultyFile) ReadAt(b []byte, off int64) (int, error) {
	if err := f.fs.fail("read"); err != nil {
		return 0, err
	}
	return f.tempFile.ReadAt(b, off)
}

func (f *faultyFile) WriteAt(b []byte, off int64) (int, error) {
	f.fs.writes = append(f.fs.writes, off)
	if err := f.fs.fail("write"); err != nil {
		n, _ := f.tempFile.WriteAt(b[:len(b)/2], off)
		return n, err
	}
	return f.tempFile.WriteAt(b, off)
}

func (f *faultyFile) Truncate(size int64) error {
	if err := f.fs.fail("truncate"); err != nil {
		return err
	}
	return f.tempFile.Truncate(size)
}

func (f *faultyFile) Sync() error {
	f.fs.syncs++
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
// before it took the checkpoint's place, the new one after) and no temporary
// file; only the spare may be left (it holds an older checkpoint; a failed
// write that wrote into it removes it). A step that
// has a way around it (the spare, the exchange) makes the write go the other
// way. Each case runs with no spare (one write before) and with a spare
// holding an older checkpoint (two writes before, so that the spare is
// longer than the new content and must be cut).
func TestWriteFailureAtEachStep(t *testing.T) {
	older := append(sampleEntries(), sampleEntries()...)
	for i := range older {
		older[i].PodUID += fmt.Sprint(i)
	}
	oldEntries := sampleEntries()
	newEntries := []PodDevicesEntry{{PodUID: "pod-2", ContainerName: "c", ResourceName: "example.com/dev",
		DeviceIDs: DevicesPerNUMA{1: {"dev-9"}}, AllocResp: []byte{}}}
	injected := errors.New("injected failure")
	tests := []struct {
		failAt  []string
		wantErr bool
		wantNew bool // the new content took the checkpoint's place
		// removed: the write had opened the spare, so its failure removes it.
		removed bool
	}{
		{failAt: []string{"mkdir"}, wantErr: true},
		{failAt: []string{"spare"}, wantNew: true},
		{failAt: []string{"spare", "create"}, wantErr: true},
		{failAt: []string{"create"}, wantNew: true},
		{failAt: []string{"write"}, wantErr: true, removed: true},
		{failAt: []string{"truncate"}, wantErr: true, removed: true},
		{failAt: []string{"sync"}, wantErr: true, removed: true},
		{failAt: []string{"close"}, wantErr: true, wantNew: true, removed: true},
		{failAt: []string{"lstat"}, wantNew: true},
		{failAt: []string{"exchange"}, wantNew: true},
		{failAt: []string{"rename"}, wantNew: true},
		{failAt: []string{"exchange", "rename"}, wantErr: true, removed: true},
		{failAt: []string{"spare", "rename"}, wantErr: true},
		{failAt: []string{"syncdir"}, wantErr: true, wantNew: true, removed: true},
	}
	for _, tc := range tests {
		for _, before := range [][][]PodDevicesEntry{{oldEntries}, {older, oldEntries}} {
			name := fmt.Sprintf("%s/%d-writes-before", strings.Join(tc.failAt, "+"), len(before))
			t.Run(name, func(t *testing.T) {
				s, dir := newTestStore(t)
				for _, entries := range before {
					require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, New(entries, sampleRegistered())))
				}

				s.fs = &faultyFS{failAt: tc.failAt, err: injected}
				err := s.CreateCheckpoint(DeviceManagerKey, New(newEntries, map[string][]string{}))
				if tc.wantErr {
					require.ErrorIs(t, err, injected)
				} else {
					require.NoError(t, err)
				}

				s.fs = osFileSystem{}
				got := New(nil, nil)
				require.NoError(t, s.GetCheckpoint(DeviceManagerKey, got), "the checkpoint stays readable")
				entries, _ := got.GetData()
				if tc.wantNew {
					assert.Equal(t, newEntries, entries)
				} else {
					assert.Equal(t, oldEntries, entries)
				}
				if tc.removed {
					assert.Empty(t, dotFiles(t, dir), "the spare written to is removed")
				} else {
					assert.Subset(t, []string{SpareName(DeviceManagerKey)}, dotFiles(t, dir),
						"no temporary file is left behind, only the spare may be")
				}
				keys, err := s.ListCheckpoints()
				require.NoError(t, err)
				assert.Equal(t, []string{DeviceManagerKey}, keys)
			})
		}
	}
}

// Writes after the first exchange the checkpoint with its spare: the file
// written becomes the checkpoint, the previous checkpoint's file the spare,
// which the next write overwrites in place (same inode) and cuts to length.
func TestWritesExchangeWithTheSpare(t *testing.T) {
	s, dir := newTestStore(t)
	ck, spare := filepath.Join(dir, DeviceManagerKey), filepath.Join(dir, SpareName(DeviceManagerKey))
	inode := func(name string) uint64 {
		t.Helper()
		info, err := os.Lstat(name)
		require.NoError(t, err)
		return info.Sys().(*syscall.Stat_t).Ino
	}
	big := append(sampleEntries(), sampleEntries()...)
	big[1].PodUID = "pod-other"
	docs := []Checkpoint{New(sampleEntries(), sampleRegistered()), New(big, sampleRegistered()), New(nil, nil)}

	require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, docs[0]))
	assert.NoFileExists(t, spare, "the first write renames its file into place")
	first := inode(ck)

	require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, docs[1]))
	assert.Equal(t, first, inode(spare), "the previous checkpoint became the spare")
	second := inode(ck)
	want0, err := docs[0].MarshalCheckpoint()
	require.NoError(t, err)
	onDisk, err := os.ReadFile(spare)
	require.NoError(t, err)
	assert.Equal(t, string(want0), string(onDisk), "the spare holds the previous content")

	require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, docs[2]))
	assert.Equal(t, first, inode(ck), "the spare was written in place and became the checkpoint")
	assert.Equal(t, second, inode(spare))
	want2, err := docs[2].MarshalCheckpoint()
	require.NoError(t, err)
	onDisk, err = os.ReadFile(ck)
	require.NoError(t, err)
	assert.Equal(t, string(want2), string(onDisk), "the longer old content was cut")
	info, err := os.Stat(ck)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())

	keys, err := s.ListCheckpoints()
	require.NoError(t, err)
	assert.Equal(t, []string{DeviceManagerKey}, keys, "the spare is not listed")

	require.NoError(t, s.RemoveCheckpoint(DeviceManagerKey))
	assert.NoFileExists(t, ck)
	assert.NoFileExists(t, spare, "removing a checkpoint removes its spare")
}

// A spare that is not a plain private file (a symbolic link, a file with
// another name, a file others may read, a directory) is neither written
// through nor exchanged: the write renames a temporary file into place and
// leaves the odd spare as it was.
func TestUnusableSpareIsLeftAlone(t *testing.T) {
	cases := map[string]func(t *testing.T, spare, outside string){
		"symlink": func(t *testing.T, spare, outside string) { require.NoError(t, os.Symlink(outside, spare)) },
		"hard link": func(t *testing.T, spare, outside string) {
			require.NoError(t, os.Link(outside, spare))
		},
		"mode 0644": func(t *testing.T, spare, outside string) {
			require.NoError(t, os.WriteFile(spare, []byte("old"), 0o600))
			require.NoError(t, os.Chmod(spare, 0o644))
		},
		"directory": func(t *testing.T, spare, outside string) { require.NoError(t, os.Mkdir(spare, 0o700)) },
	}
	for name, makeSpare := range cases {
		t.Run(name, func(t *testing.T) {
			s, dir := newTestStore(t)
			outside := filepath.Join(t.TempDir(), "victim")
			require.NoError(t, os.WriteFile(outside, []byte("not a checkpoint"), 0o600))
			require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, New(nil, nil)))
			spare := filepath.Join(dir, SpareName(DeviceManagerKey))
			makeSpare(t, spare, outside)
			before, err := os.Lstat(spare)
			require.NoError(t, err)

			require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, New(sampleEntries(), sampleRegistered())))
			got := New(nil, nil)
			require.NoError(t, s.GetCheckpoint(DeviceManagerKey, got))
			entries, _ := got.GetData()
			assert.Equal(t, sampleEntries(), entries)

			after, err := os.Lstat(spare)
			require.NoError(t, err)
			assert.True(t, os.SameFile(before, after), "the spare was replaced")
			assert.Equal(t, before.Mode(), after.Mode())
			victim, err := os.ReadFile(outside)
			require.NoError(t, err)
			assert.Equal(t, "not a checkpoint", string(victim), "a file outside was written through the spare")
			assert.Equal(t, []string{SpareName(DeviceManagerKey)}, dotFiles(t, dir), "no temporary file is left")
		})
	}
}

// On a file system that cannot exchange (or a system that has no
// exchange), writes rename the spare over the checkpoint each time.
func TestWritesWithoutExchange(t *testing.T) {
	s, dir := newTestStore(t)
	s.fs = &faultyFS{failAt: []string{"exchange"}, err: syscall.EINVAL}
	for i, entries := range [][]PodDevicesEntry{nil, sampleEntries(), {}} {
		require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, New(entries, nil)), "write %d", i)
		got := New(nil, nil)
		require.NoError(t, s.GetCheckpoint(DeviceManagerKey, got))
		gotEntries, _ := got.GetData()
		assert.Equal(t, entries, gotEntries)
		assert.Empty(t, dotFiles(t, dir), "write %d left a file", i)
	}
}

// When even the clean-up of the temporary file fails, both errors are reported.
func TestWriteFailureAndCleanupFailure(t *testing.T) {
	s, _ := newTestStore(t)
	writeErr := errors.New("disk full")
	f := &faultyFS{failAt: []string{"write"}, err: writeErr}
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

// The system calls report failures as path errors naming the files.
func TestExchangeAndDatasyncErrors(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	require.NoError(t, os.WriteFile(a, []byte("a"), 0o600))
	err := osFileSystem{}.Exchange(a, b)
	var le *os.LinkError
	require.ErrorAs(t, err, &le, "exchange with a missing file")
	assert.Equal(t, b, le.New)
	assert.ErrorIs(t, err, fs.ErrNotExist)

	f, err := os.Open(a)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	err = osFile{f}.Sync()
	require.Error(t, err, "sync of a closed file")
	assert.Contains(t, err.Error(), a)
}

// A reader that opened the checkpoint keeps reading what it opened, however
// many writes follow: the file it holds becomes the spare, and a spare open
// elsewhere is not written over (the write renames a new file instead).
func TestReaderOfOldCheckpointIsNotOverwritten(t *testing.T) {
	s, dir := newTestStore(t)
	docs := make([]Checkpoint, 4)
	blobs := make([][]byte, 4)
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
	held, err := reader.Stat()
	require.NoError(t, err)

	// docs[2] goes over the spare (docs[0]'s file, open nowhere), and the
	// file the reader holds becomes the spare; docs[3] must not go over it.
	require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, docs[2]))
	spareInfo, err := os.Lstat(filepath.Join(dir, SpareName(DeviceManagerKey)))
	require.NoError(t, err)
	require.True(t, os.SameFile(held, spareInfo), "the reader's file is the spare now")
	require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, docs[3]))

	got, err := io.ReadAll(reader)
	require.NoError(t, err)
	assert.Equal(t, string(blobs[1]), string(got), "the reader's file was written over")
	onDisk, err := os.ReadFile(ck)
	require.NoError(t, err)
	assert.Equal(t, string(blobs[3]), string(onDisk))
	assert.Equal(t, []string{SpareName(DeviceManagerKey)}, dotFiles(t, dir), "no temporary file is left")
}

// Two stores writing the same directory at once, and a reader reading
// throughout: every read decodes and verifies (never a mix of two writes),
// every write reports success, and the checkpoint ends as one store's last
// write.
func TestTwoStoresAndAReader(t *testing.T) {
	dir := t.TempDir()
	stores := make([]Manager, 2)
	for i := range stores {
		var err error
		stores[i], err = NewManager(dir)
		require.NoError(t, err)
	}
	const writes = 150
	doc := func(store, i int) Checkpoint {
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
	last0, _ := doc(0, writes-1).(*Data).GetData()
	last1, _ := doc(1, writes-1).(*Data).GetData()
	assert.Contains(t, []string{last0[0].PodUID, last1[0].PodUID}, entries[0].PodUID, "the checkpoint is not a last write")
}

// countingFS counts directory syncs.
type countingFS struct {
	osFileSystem
	syncs int
}

func (c *countingFS) SyncDir(dir string) error {
	c.syncs++
	return c.osFileSystem.SyncDir(dir)
}

// The first write over a spare in a store syncs the directory before, in
// case a crash left the exchange that made it the spare unsynced; later
// writes sync it once, after.
func TestFirstSpareWriteSyncsTheDirectoryFirst(t *testing.T) {
	s, dir := newTestStore(t)
	require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, New(nil, nil)))
	require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, New(sampleEntries(), nil)))

	m, err := NewManager(dir)
	require.NoError(t, err)
	restarted := m.(*fileStore)
	c := &countingFS{}
	restarted.fs = c
	require.NoError(t, restarted.CreateCheckpoint(DeviceManagerKey, New(nil, sampleRegistered())))
	assert.Equal(t, 2, c.syncs, "first write over the spare")
	require.NoError(t, restarted.CreateCheckpoint(DeviceManagerKey, New(sampleEntries(), sampleRegistered())))
	assert.Equal(t, 3, c.syncs, "second write")
}

// rawDoc is a checkpoint that marshals to fixed bytes.
type rawDoc []byte

func (d rawDoc) MarshalCheckpoint() ([]byte, error) { return d, nil }
func (rawDoc) UnmarshalCheckpoint([]byte) error     { return errors.New("not read") }
func (rawDoc) VerifyChecksum() error                { return nil }

// rawDocReader reads a file's bytes as they are.
type rawDocReader []byte

func (d *rawDocReader) MarshalCheckpoint() ([]byte, error) { return *d, nil }
func (d *rawDocReader) UnmarshalCheckpoint(b []byte) error {
	*d = slices.Clone(b)
	return nil
}
func (*rawDocReader) VerifyChecksum() error { return nil }

// A write over a spare the store wrote itself starts at the first byte the
// spare does not hold already, and leaves exactly the new content whatever
// the spare held: longer, shorter, equal for a while across several read
// chunks, wholly different, or unreadable.
func TestSpareIsWrittenFromTheFirstDifference(t *testing.T) {
	chunk := 64 << 10
	blob := make([]byte, 3*chunk+123)
	for i := range blob {
		blob[i] = "abcdefghijklmnopqrstuvwxyz"[i*7%26]
	}
	changedAt := func(b []byte, i int) []byte {
		c := slices.Clone(b)
		c[i] ^= 1
		return c
	}
	cases := []struct {
		name    string
		spare   []byte
		failAt  []string
		wantOff int64
	}{
		{"differs-early", changedAt(blob, 10), nil, 10},
		{"differs-in-third-chunk", changedAt(blob, 2*chunk+5), nil, int64(2*chunk + 5)},
		{"differs-at-last-byte", changedAt(blob, len(blob)-1), nil, int64(len(blob) - 1)},
		{"longer", append(slices.Clone(blob), "tail of an older, longer checkpoint"...), nil, int64(len(blob))},
		{"shorter-prefix", slices.Clone(blob[:chunk+7]), nil, int64(chunk + 7)},
		{"empty", []byte{}, nil, 0},
		{"different", []byte("{}"), nil, 0},
		{"unreadable", slices.Clone(blob), []string{"read"}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, dir := newTestStore(t)
			ck, spare := filepath.Join(dir, DeviceManagerKey), filepath.Join(dir, SpareName(DeviceManagerKey))
			// The store writes what becomes the spare, then the checkpoint.
			require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, rawDoc(tc.spare)))
			require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, rawDoc("the current checkpoint")))
			ffs := &faultyFS{failAt: tc.failAt, err: errors.New("injected")}
			s.fs = ffs
			require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, rawDoc(blob)))
			assert.Equal(t, []int64{tc.wantOff}, ffs.writes, "one write, from the first difference")
			assert.Equal(t, 1, ffs.syncs)
			got, err := os.ReadFile(ck)
			require.NoError(t, err)
			assert.True(t, bytes.Equal(blob, got), "the checkpoint holds exactly the new content")
			old, err := os.ReadFile(spare)
			require.NoError(t, err)
			assert.Equal(t, "the current checkpoint", string(old), "exchanged with the previous checkpoint")
		})
	}
}

// The store takes nothing it knows of a spare from the caller's buffer: a
// caller reusing its buffer for the next document (as the Encoder does)
// changes nothing the store knows. Each write leaves the checkpoint
// holding exactly its document.
func TestStoreKeepsNoCallerBuffer(t *testing.T) {
	s, dir := newTestStore(t)
	buf := []byte(strings.Repeat("a", 20000))
	want := func(i int) []byte {
		b := []byte(strings.Repeat("a", 20000))
		b[(i*7919)%len(b)] = byte('b' + i%20)
		return b
	}
	for i := range 12 {
		copy(buf, want(i)) // the same memory, new content
		require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, rawDoc(buf)))
		got, err := os.ReadFile(filepath.Join(dir, DeviceManagerKey))
		require.NoError(t, err)
		require.True(t, bytes.Equal(want(i), got), "write %d: the checkpoint holds its document", i)
	}
}

// A spare the store wrote and synced itself that holds exactly the new
// content (the checkpoint of two writes before, come back) is neither
// written nor synced: it only changes places with the checkpoint, and the
// store goes on trusting it. Holding the new content followed by more, or
// holding it without this store having synced it, does not count.
func TestSpareHoldingTheContentIsNotWrittenAgain(t *testing.T) {
	a, b := rawDoc(strings.Repeat("a", 100000)), rawDoc(strings.Repeat("a", 99999)+"b")
	s, dir := newTestStore(t)
	ck, spare := filepath.Join(dir, DeviceManagerKey), filepath.Join(dir, SpareName(DeviceManagerKey))
	require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, a))
	require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, b))
	for i, want := range []rawDoc{a, b, a} {
		other := b
		if i == 1 {
			other = a
		}
		ffs := &faultyFS{}
		s.fs = ffs
		require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, want))
		assert.Empty(t, ffs.writes, "write %d: nothing written", i)
		assert.Zero(t, ffs.syncs, "write %d: nothing synced", i)
		got, err := os.ReadFile(ck)
		require.NoError(t, err)
		assert.True(t, bytes.Equal(want, got), "write %d: the checkpoint holds the content", i)
		old, err := os.ReadFile(spare)
		require.NoError(t, err)
		assert.True(t, bytes.Equal(other, old), "write %d: the previous checkpoint is the spare", i)
		fresh, err := NewManager(dir)
		require.NoError(t, err)
		var read rawDocReader
		require.NoError(t, fresh.GetCheckpoint(DeviceManagerKey, &read))
		assert.True(t, bytes.Equal(want, read), "write %d: another store reads it", i)
	}

	t.Run("longer spare", func(t *testing.T) {
		s, _ := newTestStore(t)
		require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, append(slices.Clone(a), "more"...)))
		require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, b))
		ffs := &faultyFS{}
		s.fs = ffs
		require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, a))
		assert.Equal(t, []int64{int64(len(a))}, ffs.writes)
		assert.Equal(t, 1, ffs.syncs, "cut, then synced")
		got, err := os.ReadFile(filepath.Join(s.dir, DeviceManagerKey))
		require.NoError(t, err)
		assert.True(t, bytes.Equal(a, got))
	})
	t.Run("spare put there by hand", func(t *testing.T) {
		s, dir := newTestStore(t)
		require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, b))
		require.NoError(t, os.WriteFile(filepath.Join(dir, SpareName(DeviceManagerKey)), a, 0o600))
		ffs := &faultyFS{}
		s.fs = ffs
		require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, a))
		assert.Equal(t, []int64{0}, ffs.writes, "written whole")
		assert.Equal(t, 1, ffs.syncs)
	})
}

// A spare the store did not write and sync itself is written whole, even
// where it holds the new content's first bytes: one put there by hand, one
// changed since the store wrote it, one left by a write whose sync failed
// (its bytes may be in memory only: the kernel marks a page clean even when
// writing it back failed), and any spare in a new store.
func TestUntrustedSpareIsWrittenWhole(t *testing.T) {
	blob := []byte(strings.Repeat("a", 10000) + "b")
	prefix := rawDoc(strings.Repeat("a", 10000) + "c")
	cases := map[string]func(t *testing.T, s *fileStore, spare string) *fileStore{
		"put there by hand": func(t *testing.T, s *fileStore, spare string) *fileStore {
			require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, rawDoc("x")))
			require.NoError(t, os.WriteFile(spare, prefix, 0o600))
			return s
		},
		"changed since": func(t *testing.T, s *fileStore, spare string) *fileStore {
			require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, prefix))
			require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, rawDoc("x")))
			f, err := os.OpenFile(spare, os.O_WRONLY|os.O_APPEND, 0)
			require.NoError(t, err)
			_, err = f.WriteString("more")
			require.NoError(t, errors.Join(err, f.Close()))
			return s
		},
		"failed sync, spare left behind": func(t *testing.T, s *fileStore, spare string) *fileStore {
			require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, rawDoc("x")))
			require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, rawDoc("y")))
			s.fs = &faultyFS{failAt: []string{"sync", "remove"}, err: errors.New("injected")}
			require.Error(t, s.CreateCheckpoint(DeviceManagerKey, prefix))
			s.fs = osFileSystem{}
			got, err := os.ReadFile(spare)
			require.NoError(t, err)
			require.Equal(t, string(prefix), string(got), "the failed write's bytes, as the page cache holds them")
			return s
		},
		"a new store": func(t *testing.T, s *fileStore, _ string) *fileStore {
			require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, prefix))
			require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, rawDoc("x")))
			fresh, err := NewManager(s.dir)
			require.NoError(t, err)
			return fresh.(*fileStore)
		},
	}
	for name, prepare := range cases {
		t.Run(name, func(t *testing.T) {
			s, dir := newTestStore(t)
			spare := filepath.Join(dir, SpareName(DeviceManagerKey))
			s = prepare(t, s, spare)
			ffs := &faultyFS{}
			s.fs = ffs
			require.NoError(t, s.CreateCheckpoint(DeviceManagerKey, rawDoc(blob)))
			assert.Equal(t, []int64{0}, ffs.writes, "written whole")
			got, err := os.ReadFile(filepath.Join(dir, DeviceManagerKey))
			require.NoError(t, err)
			assert.Equal(t, string(blob), string(got))
		})
	}
}

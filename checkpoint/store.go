package checkpoint

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// Manager stores checkpoints under keys, one file per key in one directory.
type Manager interface {
	// CreateCheckpoint encodes cp and stores it under key, replacing what was
	// there. The previous content stays intact until the new one is complete.
	CreateCheckpoint(key string, cp Checkpoint) error
	// GetCheckpoint decodes the checkpoint stored under key into cp and verifies
	// its checksum. Errors: ErrNotFound; *DecodeError naming the file; and
	// *CorruptError, in which case cp holds the decoded (unverified) content.
	GetCheckpoint(key string, cp Checkpoint) error
	// RemoveCheckpoint removes the checkpoint under key; a missing key is not an
	// error.
	RemoveCheckpoint(key string) error
	// ListCheckpoints returns the names in the directory that do not start
	// with "." (temporary files do), sorted. A missing directory lists nothing.
	ListCheckpoints() ([]string, error)
}

// maxKeyLength is the longest key the store accepts, as in the kubelet.
const maxKeyLength = 250

// tempPrefix starts the name of every temporary file, so that listings skip them.
const tempPrefix = "."

// fileStore is the crash-safe Manager returned by NewManager.
type fileStore struct {
	dir string
	fs  fileSystem

	// mu serialises operations on the directory, so that a read never races a
	// write of the same process and concurrent writes land one after another.
	mu sync.Mutex
	// dirSynced: the directory was synced before a write over a spare.
	dirSynced bool
	// readBuf holds a chunk of the spare, read to compare (samePrefix).
	readBuf []byte
	// written are the files of the last two successful writes, newest
	// first, as they were left (see trusted).
	written [2]fileID
}

// NewManager returns a Manager that keeps checkpoints as files in dir. It touches
// no files: the directory is created (mode 0755) by the first write.
//
// A write goes to a file beside the checkpoint (mode 0600), is synced, takes
// the checkpoint's place in one atomic step, and the directory is synced, so
// that after a crash the checkpoint holds either the previous or the new
// content, never a mix. A write that fails at any step leaves the previous
// checkpoint and no other file.
//
// The file written is the key's spare, SpareName(key): once a checkpoint
// exists, a write exchanges the two files (renameat2 RENAME_EXCHANGE), so the
// previous content becomes the spare and the next write overwrites blocks
// the file system has already allocated. On a kubelet's disk that halves the
// cost of a durable write of a large checkpoint, and it lets writes go on
// while the disk is full as long as the content does not outgrow them. A
// spare this store wrote and synced itself is written from the first byte
// that differs from it (see samePrefix). A spare is written only when it is
// a plain regular file of mode 0600 with one link that no other descriptor
// has open (so a reader that opened the checkpoint before it became the
// spare never sees it rewritten, and two stores never write it at once);
// otherwise it is left alone and a new temporary file (a "." followed by
// digits) is renamed over the checkpoint, as on systems that cannot
// exchange.
//
// Keys follow the kubelet's rule: at most 250 characters of [A-Za-z0-9-_.],
// starting and ending with a letter or digit.
func NewManager(dir string) (Manager, error) {
	if dir == "" {
		return nil, errors.New("checkpoint directory must not be empty")
	}
	return &fileStore{dir: dir, fs: osFileSystem{}}, nil
}

// ValidateKey returns a *KeyError unless key is a valid checkpoint key.
func ValidateKey(key string) error {
	if !validKey(key) {
		return &KeyError{Key: key}
	}
	return nil
}

func validKey(key string) bool {
	if key == "" || len(key) > maxKeyLength {
		return false
	}
	alnum := func(c byte) bool {
		return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
	}
	if !alnum(key[0]) || !alnum(key[len(key)-1]) {
		return false
	}
	for i := 1; i < len(key)-1; i++ {
		if c := key[i]; !alnum(c) && c != '-' && c != '_' && c != '.' {
			return false
		}
	}
	return true
}

func (s *fileStore) path(key string) string { return filepath.Join(s.dir, key) }

func (s *fileStore) CreateCheckpoint(key string, cp Checkpoint) error {
	if err := ValidateKey(key); err != nil {
		return err
	}
	blob, err := cp.MarshalCheckpoint()
	if err != nil {
		return fmt.Errorf("encode checkpoint %q: %w", key, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.writeLocked(key, blob)
}

// SpareName is the name, in the checkpoint directory, of the file the store
// writes key's next content into: "." + key + "~". Like every name starting
// with ".", ListCheckpoints skips it, and so does the kubelet's own store.
func SpareName(key string) string { return tempPrefix + key + "~" }

// writeLocked replaces the file of key with blob through the spare or a
// temporary file, synced before it takes the checkpoint's place. Expects
// s.mu held.
func (s *fileStore) writeLocked(key string, blob []byte) (err error) {
	if err := s.fs.MkdirAll(s.dir, 0o755); err != nil {
		return fmt.Errorf("create checkpoint directory: %w", err)
	}
	f, spareErr := s.fs.OpenSpare(filepath.Join(s.dir, SpareName(key)))
	spare := spareErr == nil
	if spare && !s.dirSynced {
		// An exchange that a crash left unsynced may still be undone by a
		// power loss, and the spare be the checkpoint on disk again: the
		// first write over a spare in a process waits for the directory.
		if err := s.fs.SyncDir(s.dir); err != nil {
			return errors.Join(fmt.Errorf("sync directory %s: %w", s.dir, err), f.Close())
		}
		s.dirSynced = true
	}
	if !spare {
		if f, err = s.fs.CreateTemp(s.dir, tempPrefix); err != nil {
			return fmt.Errorf("create temporary checkpoint file in %s: %w", s.dir, err)
		}
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			if rmErr := s.fs.Remove(tmp); rmErr != nil && !errors.Is(rmErr, fs.ErrNotExist) {
				err = errors.Join(err, rmErr)
			}
		}
	}()
	// The os errors below name the file and the operation already. A spare
	// holds an older checkpoint: it is overwritten from the first byte that
	// differs and cut to the new length. One that holds exactly blob
	// already, and that this store synced itself, has those bytes on disk:
	// it is neither written nor synced again. That is the checkpoint of two
	// writes before coming back, as when a device's health flaps to
	// unhealthy and back; the sync alone (a flush of the disk's cache even
	// with nothing to write) costs more than the rest of such a write.
	off, holds := 0, false
	if spare {
		before := identify(f)
		if s.trusted(before) {
			off = s.samePrefix(f, blob)
			holds = off == len(blob) && before.size == int64(len(blob))
		}
		// Whatever happens to this write, the file written to is no longer
		// one this store knows the bytes of until the write has succeeded.
		s.forget(before)
	}
	var id fileID
	defer func() {
		if err == nil && id.ok {
			s.remember(id)
		}
	}()
	if !holds {
		if err := fill(f, blob, off, spare); err != nil {
			return errors.Join(fmt.Errorf("write checkpoint: %w", err), f.Close())
		}
	}
	id = identify(f)
	// A spare changes places with a regular checkpoint file, and becomes the
	// spare of the next write; anything else is replaced by a rename (which
	// fails on a directory, as the kubelet's store does). The spare stays
	// open until then, so that no other store takes it meanwhile.
	dst := s.path(key)
	exchanged := false
	if spare {
		if info, err := s.fs.Lstat(dst); err == nil && info.Mode().IsRegular() {
			exchanged = s.fs.Exchange(tmp, dst) == nil
		}
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write checkpoint: %w", err)
	}
	if !exchanged {
		if err := s.fs.Rename(tmp, dst); err != nil {
			return fmt.Errorf("write checkpoint: %w", err)
		}
	}
	// The checkpoint holds the new content; only its durability is in
	// doubt. A failure from here on removes the file written to (the
	// previous checkpoint, after an exchange), which nothing needs.
	if err := s.fs.SyncDir(s.dir); err != nil {
		return fmt.Errorf("sync directory %s: %w", s.dir, err)
	}
	return nil
}

// fill writes blob into f from offset off (f holds blob's bytes before it),
// cuts a spare to blob's length, and syncs f.
func fill(f tempFile, blob []byte, off int, spare bool) error {
	if _, err := f.WriteAt(blob[off:], int64(off)); err != nil {
		return err
	}
	if spare {
		if err := f.Truncate(int64(len(blob))); err != nil {
			return err
		}
	}
	return f.Sync()
}

// samePrefix returns how many leading bytes of blob the file f holds
// already, reading f a chunk at a time up to the first difference (0 on a
// read error). Entries are sorted, so a new checkpoint usually begins with
// the spare's first entries; leaving them unwritten leaves their pages
// clean, which the sync does not have to write (W2's last writes cost ~15%
// less).
//
// The bytes compared are the page cache's, and a clean page is on disk
// unless writing it back failed: the kernel then marks it clean anyway and
// reports the error to one sync only. So the caller trusts only a spare
// this store wrote and synced without error itself (see trusted): its
// bytes reached the disk. Whatever f holds, it holds exactly blob after the
// write.
func (s *fileStore) samePrefix(f tempFile, blob []byte) int {
	// Chunks of 64 KiB, or of about the size of a smaller checkpoint.
	if n := min(len(blob), 64<<10); len(s.readBuf) < n {
		s.readBuf = make([]byte, min(max(n, 2*len(s.readBuf)), 64<<10))
	}
	off := 0
	for off < len(blob) {
		want := blob[off:min(off+len(s.readBuf), len(blob))]
		n, err := f.ReadAt(s.readBuf[:len(want)], int64(off))
		if err != nil && !errors.Is(err, io.EOF) {
			return 0
		}
		got := s.readBuf[:n]
		if n < len(want) || !bytes.Equal(got, want) {
			for i := range got {
				if got[i] != want[i] {
					return off + i
				}
			}
			return off + n
		}
		off += n
	}
	return off
}

// fileID identifies a file as this store left it: the same inode, with the
// size and modification time it had after the store's write. An exchange
// changes neither.
type fileID struct {
	dev, ino    uint64
	size, mtime int64
	ok          bool
}

func identify(f tempFile) fileID {
	info, err := f.Stat()
	if err != nil {
		return fileID{}
	}
	return identity(info)
}

// trusted reports whether id is one of the last two files this store wrote
// and synced successfully (the spare holds the checkpoint of two writes
// before), unchanged since.
func (s *fileStore) trusted(id fileID) bool {
	return id.ok && (id == s.written[0] || id == s.written[1])
}

// forget drops what the store knew of id's file, which is about to be
// written.
func (s *fileStore) forget(id fileID) {
	for i := range s.written {
		if s.written[i].ok && s.written[i].dev == id.dev && s.written[i].ino == id.ino {
			s.written[i] = fileID{}
		}
	}
}

func (s *fileStore) remember(id fileID) { s.written[0], s.written[1] = id, s.written[0] }

func (s *fileStore) GetCheckpoint(key string, cp Checkpoint) error {
	if err := ValidateKey(key); err != nil {
		return err
	}
	p := s.path(key)
	s.mu.Lock()
	blob, err := s.fs.ReadFile(p)
	s.mu.Unlock()
	var notRegular *notRegularError
	if errors.As(err, &notRegular) {
		return &DecodeError{Path: p, Err: err}
	}
	if errors.Is(err, fs.ErrNotExist) {
		return ErrNotFound
	}
	if err != nil {
		return fmt.Errorf("read checkpoint: %w", err)
	}
	if err := cp.UnmarshalCheckpoint(blob); err != nil {
		var de *DecodeError
		if errors.As(err, &de) {
			return &DecodeError{Path: p, Err: de.Err}
		}
		return &DecodeError{Path: p, Err: err}
	}
	return cp.VerifyChecksum()
}

func (s *fileStore) RemoveCheckpoint(key string) error {
	if err := ValidateKey(key); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.fs.Remove(s.path(key)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove checkpoint: %w", err)
	}
	// The spare holds an older copy of the content; it goes too.
	if err := s.fs.Remove(filepath.Join(s.dir, SpareName(key))); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove checkpoint: %w", err)
	}
	return nil
}

func (s *fileStore) ListCheckpoints() ([]string, error) {
	s.mu.Lock()
	entries, err := s.fs.ReadDir(s.dir)
	s.mu.Unlock()
	if errors.Is(err, fs.ErrNotExist) {
		return []string{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list checkpoints: %w", err)
	}
	keys := make([]string, 0, len(entries))
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), tempPrefix) {
			keys = append(keys, e.Name())
		}
	}
	return keys, nil
}

// fileSystem is the part of the operating system the store uses; tests replace
// it to fail each step of a write.
type fileSystem interface {
	MkdirAll(dir string, perm os.FileMode) error
	CreateTemp(dir, pattern string) (tempFile, error)
	// OpenSpare opens or creates name for writing; it fails unless name is a
	// regular file (not a symbolic link) with mode 0600 and one link.
	OpenSpare(name string) (tempFile, error)
	Lstat(name string) (fs.FileInfo, error)
	// Exchange swaps the files at a and b, atomically; both must exist.
	Exchange(a, b string) error
	Rename(from, to string) error
	Remove(name string) error
	SyncDir(dir string) error
	ReadFile(name string) ([]byte, error)
	ReadDir(dir string) ([]os.DirEntry, error)
}

type tempFile interface {
	Name() string
	Stat() (fs.FileInfo, error)
	ReadAt(b []byte, off int64) (int, error)
	WriteAt(b []byte, off int64) (int, error)
	Truncate(size int64) error
	// Sync makes the content and the size durable (fdatasync where the
	// system has it): the rename or exchange that follows and the sync of
	// the directory make the rest durable.
	Sync() error
	Close() error
}

type osFileSystem struct{}

// osFile is an *os.File whose Sync syncs the data (see datasync).
type osFile struct{ *os.File }

func (f osFile) Sync() error { return datasync(f.File) }

func (osFileSystem) MkdirAll(dir string, perm os.FileMode) error { return os.MkdirAll(dir, perm) }
func (osFileSystem) CreateTemp(dir, pattern string) (tempFile, error) {
	f, err := os.CreateTemp(dir, pattern)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

func (osFileSystem) OpenSpare(name string) (tempFile, error) { return openSpare(name) }

func (osFileSystem) Lstat(name string) (fs.FileInfo, error) { return os.Lstat(name) }
func (osFileSystem) Exchange(a, b string) error             { return exchange(a, b) }
func (osFileSystem) Rename(from, to string) error           { return os.Rename(from, to) }
func (osFileSystem) Remove(name string) error               { return os.Remove(name) }

// ReadFile reads a regular file only: a FIFO, a device or a directory in the
// checkpoint's place is refused at once (reading a FIFO would block).
func (osFileSystem) ReadFile(name string) ([]byte, error) {
	info, err := os.Stat(name)
	if err != nil {
		return nil, err
	}
	if !info.Mode().IsRegular() {
		return nil, &notRegularError{path: name, mode: info.Mode()}
	}
	return os.ReadFile(name)
}

// notRegularError reports a checkpoint path that holds no regular file.
type notRegularError struct {
	path string
	mode fs.FileMode
}

func (e *notRegularError) Error() string {
	return fmt.Sprintf("%s is not a regular file (mode %s)", e.path, e.mode)
}
func (osFileSystem) ReadDir(dir string) ([]os.DirEntry, error) { return os.ReadDir(dir) }

func (osFileSystem) SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}

// RemoveTempFiles removes the temporary files that writes interrupted by a
// crash left in dir (regular files named "." followed by digits, as the store
// creates them) and returns how many it removed. Call it only while nothing
// writes checkpoints in dir, as the device manager does at start.
func RemoveTempFiles(dir string) (int, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	removed := 0
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || len(name) < 2 || !strings.HasPrefix(name, tempPrefix) ||
			strings.Trim(name[1:], "0123456789") != "" {
			continue
		}
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		removed++
	}
	return removed, errors.Join(errs...)
}

package checkpoint

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
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

	// mu serialises the store's operations, so that a read never races a
	// write of the same process and concurrent writes land one after the
	// other.
	mu sync.Mutex
}

// NewManager returns a Manager that keeps checkpoints as files in dir. It touches
// no files: the directory is created (mode 0755) by the first write.
//
// A write is the textbook durable write: a new temporary file in dir (mode
// 0600, named "." followed by digits), the content written and synced, the
// file renamed over the checkpoint, and dir synced. After a crash or a power
// loss the checkpoint holds either the previous or the new content, never a
// mix; once CreateCheckpoint has returned nil the new content is on disk. A
// write that fails at any step before the rename leaves the previous
// checkpoint and no other file. A crash can leave a temporary file behind;
// RemoveTempFiles removes them.
//
// Keys follow the kubelet's rule: at most 250 characters of [A-Za-z0-9-_.],
// starting and ending with a letter or digit.
func NewManager(dir string) (Manager, error) {
	if dir == "" {
		return nil, errors.New("checkpoint directory must not be empty")
	}
	return &fileStore{dir: dir, fs: osFileSystem{}}, nil
}

// keyPattern is the kubelet's rule for checkpoint keys (see NewManager).
var keyPattern = regexp.MustCompile(`^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$`)

// ValidateKey returns a *KeyError unless key is a valid checkpoint key.
func ValidateKey(key string) error {
	if len(key) > maxKeyLength || !keyPattern.MatchString(key) {
		return &KeyError{Key: key}
	}
	return nil
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

// writeLocked replaces the file of key with blob: temporary file, write,
// fsync, rename, fsync of the directory. Expects s.mu held.
func (s *fileStore) writeLocked(key string, blob []byte) (err error) {
	if err := s.fs.MkdirAll(s.dir, 0o755); err != nil {
		return fmt.Errorf("create checkpoint directory: %w", err)
	}
	f, err := s.fs.CreateTemp(s.dir, tempPrefix)
	if err != nil {
		return fmt.Errorf("create temporary checkpoint file in %s: %w", s.dir, err)
	}
	tmp := f.Name()
	renamed := false
	defer func() {
		if err != nil && !renamed {
			if rmErr := s.fs.Remove(tmp); rmErr != nil && !errors.Is(rmErr, fs.ErrNotExist) {
				err = errors.Join(err, rmErr)
			}
		}
	}()
	// The os errors below name the file and the operation already.
	if _, err := f.Write(blob); err != nil {
		return errors.Join(fmt.Errorf("write checkpoint: %w", err), f.Close())
	}
	if err := f.Sync(); err != nil {
		return errors.Join(fmt.Errorf("write checkpoint: %w", err), f.Close())
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write checkpoint: %w", err)
	}
	// A rename over a directory fails, as in the kubelet's store.
	if err := s.fs.Rename(tmp, s.path(key)); err != nil {
		return fmt.Errorf("write checkpoint: %w", err)
	}
	renamed = true
	// The checkpoint holds the new content; only its durability is in doubt.
	if err := s.fs.SyncDir(s.dir); err != nil {
		return fmt.Errorf("sync directory %s: %w", s.dir, err)
	}
	return nil
}

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
			err = de.Err
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
	Rename(from, to string) error
	Remove(name string) error
	SyncDir(dir string) error
	ReadFile(name string) ([]byte, error)
	ReadDir(dir string) ([]os.DirEntry, error)
}

type tempFile interface {
	Name() string
	Write(b []byte) (int, error)
	Sync() error
	Close() error
}

type osFileSystem struct{}

func (osFileSystem) MkdirAll(dir string, perm os.FileMode) error { return os.MkdirAll(dir, perm) }
func (osFileSystem) CreateTemp(dir, pattern string) (tempFile, error) {
	f, err := os.CreateTemp(dir, pattern)
	if err != nil {
		return nil, err
	}
	return f, nil
}
func (osFileSystem) Rename(from, to string) error { return os.Rename(from, to) }
func (osFileSystem) Remove(name string) error     { return os.Remove(name) }

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

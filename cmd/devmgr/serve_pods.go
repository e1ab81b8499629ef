package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

// podsFileName is the file, in the checkpoint directory, that keeps the pods
// admitted through the control socket across restarts of "devmgr serve": the
// manager restores the devices from its checkpoint, and these pods keep them
// active, or its garbage collection would drop them. The leading "." keeps
// the file (and its temporary files) out of the checkpoint store's listing,
// so ShouldResetExtendedResourceCapacity ignores it.
const podsFileName = ".devmgr-serve-pods.json"

// podsFileVersion is the version of podsFile; a file of another version is
// refused rather than misread.
const podsFileVersion = 1

// podsFile is the content of podsFileName.
type podsFile struct {
	Version int `json:"version"`
	// Pods are the admitted pods in admission order, as
	// Admitter.AdmittedPods gives them (UID and namespace set).
	Pods []*v1.Pod `json:"pods"`
}

// podStore reads and writes podsFileName. Writes are atomic (temporary file,
// fsync, rename, fsync of the directory) and serialised.
type podStore struct {
	dir  string
	path string

	// mu serialises sync, so the file always ends with the newest snapshot.
	mu sync.Mutex
}

func newPodStore(dir string) *podStore {
	return &podStore{dir: dir, path: filepath.Join(dir, podsFileName)}
}

// load returns the saved pods; none when the file does not exist.
func (s *podStore) load() ([]*v1.Pod, error) {
	blob, err := os.ReadFile(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read admitted pods: %w", err)
	}
	var f podsFile
	dec := json.NewDecoder(bytes.NewReader(blob))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("read admitted pods from %s: %w (move the file aside to start without them; their devices are then freed)", s.path, err)
	}
	if f.Version != podsFileVersion {
		return nil, fmt.Errorf("read admitted pods from %s: version %d, want %d", s.path, f.Version, podsFileVersion)
	}
	return f.Pods, nil
}

// removeTempFiles removes the temporary files a write cut short (by a kill or
// a power loss) left in the directory; failures are logged, not fatal.
func (s *podStore) removeTempFiles(logger klog.Logger) {
	left, _ := filepath.Glob(filepath.Join(s.dir, tempPattern(s.path)))
	for _, p := range left {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			logger.Error(err, "Failed to remove a temporary file of the admitted pods", "path", p)
			continue
		}
		logger.Info("Removed a temporary file of the admitted pods", "path", p)
	}
}

// tempPattern is the os.CreateTemp pattern of path's temporary files. A
// leading "." keeps them out of directory listings that skip hidden files,
// as the checkpoint store's does.
func tempPattern(path string) string {
	return "." + strings.TrimPrefix(filepath.Base(path), ".") + ".tmp-*"
}

// sync writes the pods snapshot returns, taking the snapshot under the
// store's lock so that concurrent callers cannot write an older one last.
func (s *podStore) sync(snapshot func() []*v1.Pod) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	pods := snapshot()
	if pods == nil {
		pods = []*v1.Pod{}
	}
	blob, err := json.MarshalIndent(podsFile{Version: podsFileVersion, Pods: pods}, "", "  ")
	if err != nil {
		return fmt.Errorf("encode admitted pods: %w", err)
	}
	if err := writeFileAtomic(s.dir, s.path, append(blob, '\n')); err != nil {
		return fmt.Errorf("save admitted pods: %w", err)
	}
	return nil
}

// writeFileAtomic replaces path, in dir, with blob: a reader sees the old
// content or the new one, and the new one survives a crash once it returns.
func writeFileAtomic(dir, path string, blob []byte) (err error) {
	tmp, err := os.CreateTemp(dir, tempPattern(path))
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err := tmp.Write(blob); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

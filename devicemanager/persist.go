package devicemanager

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/openkubelet/devmgr/checkpoint"
	"github.com/openkubelet/devmgr/endpoint"
)

// The checkpoint holds the ledger's records and the healthy device IDs of every
// registered resource. It is written after a successful admission (before
// Allocate returns), after a device update that changes the healthy set, and
// after GetCapacity removes a resource; never on disconnect, garbage
// collection or Stop. The same history always gives the same bytes, and a
// write that would not change the file is skipped.

// checkpointWriter writes the checkpoint. Its lock serialises the writes;
// it is taken before the manager's, never while that is held.
type checkpointWriter struct {
	mu    sync.Mutex
	store checkpoint.Manager
	// written is the core's generation the file reflects, and last what
	// the file holds (nil when unknown); doc keeps the encoding of each
	// entry between writes, so that an admission encodes only its own.
	written uint64
	last    []byte
	doc     *checkpoint.Data
}

// persist makes sure the checkpoint on disk reflects at least generation gen
// of the core. Concurrent callers share writes: whoever takes the writer's
// lock first writes the newest state, and the others find their generation
// covered. Neither encoding nor the disk write happens under m.mu.
func (m *ManagerImpl) persist(gen uint64) error {
	w := &m.writer
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.written >= gen {
		return nil
	}
	m.mu.Lock()
	m.awaitSettledLocked()
	entries, registered, err := m.core.snapshot()
	current := m.core.gen
	m.mu.Unlock()
	if err != nil {
		m.log.Error(err, "Some allocation records cannot be written to the checkpoint")
	}

	start := time.Now()
	w.doc.SetData(entries, registered)
	blob, err := w.doc.MarshalCheckpoint()
	if err == nil && bytes.Equal(blob, w.last) {
		// The file holds this content already (a plugin that comes back
		// with the devices it had, say).
		m.metrics.checkpointTotal.WithLabelValues("unchanged").Inc()
		w.written = current
		return nil
	}
	if err == nil {
		err = w.store.CreateCheckpoint(checkpoint.DeviceManagerKey, encoded(blob))
	}
	if err != nil {
		m.metrics.checkpointTotal.WithLabelValues("failed").Inc()
		// The file may or may not hold blob now: the next write is not
		// skipped.
		w.last = nil
		return err
	}
	m.metrics.checkpointWrite.Observe(time.Since(start).Seconds())
	m.metrics.checkpointBytes.Set(float64(len(blob)))
	m.metrics.checkpointTotal.WithLabelValues("written").Inc()
	m.log.V(4).Info("Wrote checkpoint", "bytes", len(blob), "checksum", w.doc.Checksum())
	w.written, w.last = current, blob
	return nil
}

// encoded is an already encoded checkpoint, handed to the store as is.
type encoded []byte

func (e encoded) MarshalCheckpoint() ([]byte, error) { return e, nil }
func (encoded) UnmarshalCheckpoint([]byte) error {
	return errors.New("encoded checkpoint is write-only")
}
func (encoded) VerifyChecksum() error { return errors.New("encoded checkpoint is write-only") }

// readCheckpoint restores the ledger and the registered resources from the
// checkpoint. A missing file means a fresh node; a file that cannot be used is
// moved aside for inspection and the manager starts empty.
func (m *ManagerImpl) readCheckpoint() {
	data := checkpoint.New(nil, nil)
	err := m.writer.store.GetCheckpoint(checkpoint.DeviceManagerKey, data)
	switch {
	case errors.Is(err, checkpoint.ErrNotFound):
		m.log.V(2).Info("No checkpoint found; starting with no allocations", keyPath, m.checkpointPath())
		return
	case err != nil:
		aside := m.asidePath()
		if mvErr := os.Rename(m.checkpointPath(), aside); mvErr != nil {
			m.log.Error(errors.Join(err, mvErr), "Continue after failing to read checkpoint file. Device allocation info may NOT be up-to-date",
				keyPath, m.checkpointPath())
			return
		}
		m.log.Error(err, "Continue after failing to read checkpoint file. Device allocation info may NOT be up-to-date; the file was moved aside",
			keyPath, aside)
		return
	}
	entries, registered := data.GetData()
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.core.restore(entries, registered, func(name string) *endpoint.Endpoint {
		return endpoint.NewStopped(name, m.opts.Clock)
	}); err != nil {
		m.log.Error(err, "Some checkpoint entries could not be restored")
	}
	m.log.V(2).Info("Restored allocations from checkpoint", keyCount, len(entries), "resources", len(registered),
		"legacyFormat", data.Legacy())
}

// asidePath returns kubelet_internal_checkpoint.bad-<unix time>, with a
// ".N" suffix when that name is taken (two bad files within one second), so
// that no earlier bad file is ever replaced.
func (m *ManagerImpl) asidePath() string {
	base := fmt.Sprintf("%s.bad-%d", m.checkpointPath(), m.opts.Clock.Now().Unix())
	name := base
	for i := 1; ; i++ {
		if _, err := os.Lstat(name); errors.Is(err, os.ErrNotExist) {
			return name
		}
		name = fmt.Sprintf("%s.%d", base, i)
	}
}

// removeTempFiles removes temporary files left by checkpoint writes that a
// crash interrupted; nothing writes the checkpoint yet.
func (m *ManagerImpl) removeTempFiles() {
	n, err := checkpoint.RemoveTempFiles(m.opts.CheckpointDir)
	if err != nil {
		m.log.Error(err, "Failed to remove temporary checkpoint files", keyPath, m.opts.CheckpointDir)
	}
	if n > 0 {
		m.log.V(2).Info("Removed temporary files of interrupted checkpoint writes", keyCount, n, keyPath, m.opts.CheckpointDir)
	}
}

func (m *ManagerImpl) checkpointPath() string {
	return filepath.Join(m.opts.CheckpointDir, checkpoint.DeviceManagerKey)
}

// Group commit. An admission is on disk before Allocate returns, and each
// durable write waits for the disk (two fsyncs), so admissions running side
// by side would queue behind each other's writes. Before writing, a writer
// waits a little while plugin calls of other admissions are in flight (the
// ledger's pending reservations): when they commit in time, one write
// covers them all, and their own persist finds its generation written. The
// wait is at most groupCommitWait per write, so a hung plugin delays the
// others' writes by no more. It measures the disk's time, not the
// manager's: it runs on the real clock, never on Options.Clock, which a
// test may hold still.
const groupCommitWait = time.Millisecond

// awaitSettledLocked waits, up to groupCommitWait, while reservations are
// pending. Expects m.mu held; releases it while waiting.
func (m *ManagerImpl) awaitSettledLocked() {
	if m.core.ledger.Pending() == 0 {
		return
	}
	timer := time.NewTimer(groupCommitWait)
	defer timer.Stop()
	for m.core.ledger.Pending() > 0 {
		settled := m.settled.wait()
		m.mu.Unlock()
		select {
		case <-settled:
			m.mu.Lock()
		case <-timer.C:
			m.mu.Lock()
			return
		}
	}
}

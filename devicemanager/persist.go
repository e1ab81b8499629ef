package devicemanager

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/openkubelet/devmgr/checkpoint"
	"github.com/openkubelet/devmgr/endpoint"
	"github.com/openkubelet/devmgr/podstate"
)

// The checkpoint holds the ledger's records and the healthy device IDs of every
// registered resource. It is written after a successful admission (before
// Allocate returns), after a device update that changes the healthy set, and
// after GetCapacity removes a resource; never on disconnect, garbage
// collection or Stop. The same history always gives the same bytes, and a
// write that would not change the file is skipped.

// snapshotLocked returns the content of the checkpoint for the current state:
// the ledger's entries, in admission order, and the sorted healthy IDs of
// each registered resource. Expects m.mu held.
func (m *ManagerImpl) snapshotLocked() ([]checkpoint.PodDevicesEntry, map[string][]string) {
	entries, err := m.ledger.ToCheckpoint()
	if err != nil {
		m.log.Error(err, "Some allocation records cannot be written to the checkpoint")
	}
	registered := make(map[string][]string, len(m.resources))
	for name, r := range m.resources {
		if r.registered {
			registered[name] = r.sortedHealthy()
		}
	}
	return entries, registered
}

// persist makes sure the checkpoint on disk reflects at least generation gen
// of the state. Concurrent callers share writes: whoever takes writeMu first
// writes the newest state, and the others find their generation covered.
// Neither encoding nor the disk write happens under m.mu.
func (m *ManagerImpl) persist(gen uint64) error {
	m.writeMu.Lock()
	defer m.writeMu.Unlock()
	if m.writtenGen >= gen {
		return nil
	}
	m.mu.Lock()
	m.awaitInflightLocked()
	entries, registered := m.snapshotLocked()
	current := m.gen
	m.mu.Unlock()

	start := time.Now()
	// m.doc keeps the encoding of each entry between writes, so that an
	// admission encodes only its own entries.
	m.doc.SetData(entries, registered)
	blob, err := m.doc.MarshalCheckpoint()
	if err == nil && bytes.Equal(blob, m.lastBlob) {
		// The file holds this content already (a plugin that comes back
		// with the devices it had, say).
		m.metrics.checkpointTotal.WithLabelValues("unchanged").Inc()
		m.writtenGen = current
		return nil
	}
	if err == nil {
		err = m.store.CreateCheckpoint(checkpoint.DeviceManagerKey, encoded(blob))
	}
	if err != nil {
		m.metrics.checkpointTotal.WithLabelValues("failed").Inc()
		// The file may or may not hold blob now: the next write is not
		// skipped.
		m.lastBlob = nil
		return err
	}
	m.metrics.checkpointWrite.Observe(time.Since(start).Seconds())
	m.metrics.checkpointBytes.Set(float64(len(blob)))
	m.metrics.checkpointTotal.WithLabelValues("written").Inc()
	m.log.V(4).Info("Wrote checkpoint", "bytes", len(blob), "checksum", m.doc.Checksum())
	m.writtenGen, m.lastBlob = current, blob
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
	err := m.store.GetCheckpoint(checkpoint.DeviceManagerKey, data)
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
	if err := m.ledger.FromCheckpoint(entries); err != nil {
		m.log.Error(err, "Some checkpoint entries could not be restored")
	}
	for name := range registered {
		r := m.resourceLocked(name)
		r.registered = true
		r.primary = endpoint.NewStopped(name, m.opts.Clock)
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
// durable write waits for the disk (two fsyncs), so admissions running side by
// side would queue behind each other's writes. Before writing, a writer
// waits a little for admissions whose plugin call is in flight: when they
// commit in time, one write covers them all, and their own persist finds its
// generation written. The wait is short and only for calls that started
// recently, so a hung plugin delays nobody else by more than groupCommitWait
// per write, and not at all once its call is older than groupCommitRecent.
const (
	groupCommitWait   = time.Millisecond
	groupCommitRecent = 10 * time.Millisecond
)

// awaitInflightLocked waits, up to groupCommitWait, while a plugin call that
// started less than groupCommitRecent ago is in flight. Expects m.mu held;
// releases it while waiting.
func (m *ManagerImpl) awaitInflightLocked() {
	var timer *time.Timer
	for {
		now := time.Now()
		recent := false
		for _, start := range m.inflightRPCs {
			if now.Sub(start) < groupCommitRecent {
				recent = true
				break
			}
		}
		if !recent {
			break
		}
		if timer == nil {
			timer = time.NewTimer(groupCommitWait)
			defer timer.Stop()
		}
		changed := m.inflightChanged
		m.mu.Unlock()
		select {
		case <-changed:
			m.mu.Lock()
			continue
		case <-timer.C:
		}
		m.mu.Lock()
		break
	}
}

// inflightDoneLocked records that a reservation's plugin call ended (it is
// committed or rolled back) and wakes writers waiting for it. Expects m.mu
// held.
func (m *ManagerImpl) inflightDoneLocked(rid podstate.ReservationID) {
	if _, ok := m.inflightRPCs[rid]; !ok {
		return
	}
	delete(m.inflightRPCs, rid)
	close(m.inflightChanged)
	m.inflightChanged = make(chan struct{})
}

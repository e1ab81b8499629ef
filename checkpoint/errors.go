package checkpoint

import (
	"errors"
	"fmt"
)

// ErrNotFound is returned by GetCheckpoint when no checkpoint is stored under the
// key. Its text is the kubelet's.
var ErrNotFound = errors.New("checkpoint is not found")

// CorruptError reports a checkpoint whose stored checksum does not match the
// checksum of its content. ActualCS is the checksum computed from the decoded
// content; ExpectedCS is the one stored in the file.
//
// GetCheckpoint and VerifyChecksum return it as *CorruptError. Its Is method
// matches any CorruptError, so errors.Is(err, &CorruptError{}) and
// errors.Is(err, CorruptError{}) both report a corrupt checkpoint; use
// errors.As to read the two checksums.
type CorruptError struct {
	ActualCS, ExpectedCS uint64
}

// Error returns the kubelet's message for a corrupt checkpoint.
func (e CorruptError) Error() string { return "checkpoint is corrupted" }

// Is reports whether target is a CorruptError, whatever its checksums.
func (e CorruptError) Is(target error) bool {
	switch target.(type) {
	case CorruptError, *CorruptError:
		return true
	}
	return false
}

// KeyError reports a checkpoint key that the store refuses (see NewManager).
type KeyError struct{ Key string }

func (e *KeyError) Error() string { return fmt.Sprintf("invalid key: %q", e.Key) }

// DecodeError reports a checkpoint that is not valid JSON of the expected
// layout. It names the file (empty when the bytes did not come from a file) and
// wraps the encoding/json error, which says why.
type DecodeError struct {
	Path string
	Err  error
}

func (e *DecodeError) Error() string {
	if e.Path == "" {
		return "decode checkpoint: " + e.Err.Error()
	}
	return fmt.Sprintf("decode checkpoint %s: %v", e.Path, e.Err)
}

// Unwrap returns the JSON error.
func (e *DecodeError) Unwrap() error { return e.Err }

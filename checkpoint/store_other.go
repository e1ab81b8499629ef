//go:build !linux

package checkpoint

import (
	"errors"
	"io/fs"
	"os"
)

// openSpare fails: without exchange a spare buys nothing, and every write
// goes through a new temporary file.
func openSpare(name string) (tempFile, error) {
	return nil, &os.PathError{Op: "open spare", Path: name, Err: errors.ErrUnsupported}
}

// exchange is not available: every write renames a new file over the
// checkpoint.
func exchange(a, b string) error {
	return &os.LinkError{Op: "exchange", Old: a, New: b, Err: errors.ErrUnsupported}
}

func datasync(f *os.File) error { return f.Sync() }

// identity knows no file: without a spare there is nothing to trust.
func identity(fs.FileInfo) fileID { return fileID{} }

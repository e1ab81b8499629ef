// Package checkpoint reads and writes the kubelet's device manager checkpoint,
// kubelet_internal_checkpoint, byte for byte as the kubelet does, and stores it
// crash-safely.
//
// # Format
//
// The file is the JSON document
//
//	{"Data":{"PodDeviceEntries":[...],"RegisteredDevices":{...}},"Checksum":N}
//
// as encoding/json writes the kubelet's structs, where N is the kubelet's
// checksum: FNV-1a (32 bit) over the go-spew text of the Data object. That
// text contains Go type names such as "checkpoint.PodDevicesEntry", which is
// why this package must be named checkpoint and why its types keep the
// kubelet's names and field order. The checksum text is printed without
// reflection; tests and a fuzz target prove it equal to go-spew's.
//
// Data is the codec: New builds one from allocation records (SetData gives
// an existing one new records), MarshalCheckpoint encodes exactly what it
// was given, in that order (ordering is the caller's job), UnmarshalCheckpoint
// decodes, and VerifyChecksum checks. Files written by kubelets before 1.20,
// where DeviceIDs was a plain list, are read too: their devices are reported
// under NUMA node -1 (no topology). The kubelet itself no longer reads them
// and loses those allocations on upgrade.
//
// # Store
//
// NewManager returns a Manager that keeps one file per key in a directory,
// written crash-safely (see NewManager): readers never see a partial file,
// and after a crash the checkpoint holds the previous or the new content.
// Errors: ErrNotFound for a missing checkpoint, *CorruptError for a checksum
// mismatch, *DecodeError (naming the file) for a document that does not
// decode, and *KeyError for a key the store refuses.
//
// # Concurrency and lifecycle
//
// A Data is a plain value and is not safe for concurrent use. The Manager
// returned by NewManager is safe for concurrent use; it holds no open files
// between calls and needs no closing.
package checkpoint

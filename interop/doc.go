// Package interop runs devmgr against device plugins that nobody on the team
// wrote, built at pinned versions from the Go module proxy. Its tests carry
// the build tag "interop" and run with `make interop` (also part of .ci/run):
// they need root and `unshare -m`, and the first run downloads and builds the
// plugins (several minutes); later runs reuse .cache/interop.
package interop

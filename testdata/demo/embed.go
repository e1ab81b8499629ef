// Package demo holds the pods that "devmgr demo" admits, as Kubernetes pod
// manifests. They are embedded in the devmgr binary, so the demo runs from
// any directory; edit them here and rebuild.
package demo

import "embed"

// Pods holds every *.yaml manifest of this directory. The demo admits them
// in file-name order.
//
//go:embed *.yaml
var Pods embed.FS

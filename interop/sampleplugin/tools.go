//go:build tools

// Package sampleplugin pins the Kubernetes sample device plugin
// (k8s.io/kubernetes/test/images/sample-device-plugin) at v1.37.2 for the
// interop suite. `go install module@version` refuses it because
// k8s.io/kubernetes replaces its staging modules with local paths; this
// module requires k8s.io/kubernetes and maps every k8s.io staging module to
// its v0.37.2 release instead, so that
//
//	go build k8s.io/kubernetes/test/images/sample-device-plugin
//
// works from here. Nothing of it is devmgr's code.
package sampleplugin

import _ "k8s.io/kubernetes/test/images/sample-device-plugin"

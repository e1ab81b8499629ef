//go:build devmgronly

package main

import (
	"errors"

	"github.com/go-logr/logr"
)

// kubeletLinked: this build has no kubelet's device manager to run.
const kubeletLinked = false

// newKubeletSubject, in a bench built with -tags devmgronly, refuses: that
// build links no k8s.io/kubernetes package (see buildSides).
func newKubeletSubject(string, logr.Logger) (subject, error) {
	return nil, errors.New("this bench was built with -tags devmgronly, without the kubelet's device manager")
}

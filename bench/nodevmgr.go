//go:build kubeletonly

package main

import (
	"errors"

	"github.com/go-logr/logr"
)

// devmgrLinked: this build has no devmgr to run.
const devmgrLinked = false

// newDevmgrSubject, in a bench built with -tags kubeletonly, refuses: that
// build links the kubelet's device manager only (see buildSides).
func newDevmgrSubject(string, logr.Logger) (subject, error) {
	return nil, errors.New("this bench was built with -tags kubeletonly, without devmgr")
}

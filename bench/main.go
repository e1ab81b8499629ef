// Command bench runs the same device-manager workloads against devmgr and
// against the kubelet's own device manager (k8s.io/kubernetes v1.37.2,
// pkg/kubelet/cm/devicemanager), each run in a fresh process, and reports
// medians, spreads, ratios and peak RSS.
//
//	bench compare [-runs 5] [-out FILE] [-workdir /var/tmp] [-only REGEXP] [-split [-go go]]
//	bench run -impl devmgr|kubelet -workload W1|W2|W3|W4prep|W4|W5|W6|floor -dir DIR [flags]
//
// compare runs `bench run` in a fresh process for every run, from this
// binary (with -split, from a build per side that links one implementation:
// -tags devmgronly, -tags kubeletonly), the kubelet's side inside a private
// mount namespace (it needs root and unshare -m), and writes a markdown
// report. run executes one workload and prints one JSON
// line. This module is apart from devmgr's so that the library never depends
// on k8s.io/kubernetes.
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "compare":
		err = compareMain(os.Args[2:])
	case "run":
		err = runMain(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, `usage:
  bench compare [-runs 5] [-out FILE] [-workdir /var/tmp] [-impls devmgr,kubelet] [-only REGEXP] [-split [-go go]]
  bench run -impl devmgr|kubelet -workload W1|W2|W3|W4prep|W4|W5|W6|floor -dir DIR [flags]`)
	os.Exit(2)
}

// Command etcd is the etcd server at the version this module pins, for the
// end-to-end tests: k8s.io/kubernetes requires a newer etcd, so the server
// builds in a module of its own.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }

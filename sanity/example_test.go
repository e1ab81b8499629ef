package sanity_test

import (
	"testing"

	"github.com/openkubelet/devmgr/sanity"
)

// The example of a plugin's own test in docs/PLUGIN-AUTHORS.md, and the
// test of Test: a correct plugin passes every subtest. startMyPlugin stands
// for starting the plugin under test, here the suite's correct fixture.
func TestMyPlugin(t *testing.T) {
	sanity.Test(t, sanity.Config{
		StartPlugin: func(socketDir string) error {
			return startMyPlugin(t, socketDir) // serves, then registers on socketDir/kubelet.sock
		},
	})
}

func startMyPlugin(t *testing.T, socketDir string) error {
	return newFixture().start(t)(socketDir)
}

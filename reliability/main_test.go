//go:build reliability

package reliability

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"
)

// Counts of the suite; CI runs the defaults, larger runs raise them.
var (
	kills      = flag.Int("kills", 200, "crash consistency: SIGKILLs of the admitting child process")
	losses     = flag.Int("losses", 120, "power loss: SIGKILLs of the admitting child process, each followed by a power loss (LazyFS)")
	serveKills = flag.Int("serve-kills", 100, "devmgr serve: SIGKILLs of serve, and as many SIGKILLs each followed by a power loss (LazyFS)")
	cycles     = flag.Int("cycles", 100, "churn: plugin start/register/allocate/crash/re-register cycles")
	admissions = flag.Int("admissions", 10000, "load: admissions across 8 goroutines")
	flipBits   = flag.Int("flips", 2000, "checkpoint damage: random bit flips tried")
	report     = flag.String("report", "", "append the figures of this run as JSON lines to this file (docs/RELIABILITY.md is made from them)")
	// requireLazyFS makes a run without -lazyfs fail instead of skipping
	// the power-loss categories (CI sets it).
	requireLazyFS = flag.Bool("require-lazyfs", false, "fail, instead of skipping the power-loss categories, when -lazyfs is not given")
)

// childEnv names, in the environment of a re-executed test binary, the child
// role it must play instead of running the tests.
const childEnv = "DEVMGR_RELIABILITY_CHILD"

// children are the roles a re-executed test binary can play; test files
// register theirs in init. Each returns the process's exit code.
var children = map[string]func() int{}

func TestMain(m *testing.M) {
	flag.Parse()
	if role := os.Getenv(childEnv); role != "" {
		run, ok := children[role]
		if !ok {
			fmt.Fprintf(os.Stderr, "unknown child role %q\n", role)
			os.Exit(2)
		}
		os.Exit(run())
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		removeDevmgrBinary()
		os.Exit(code)
	}))
}

// Figures is what one category of the suite reports: cases tried, faults
// injected and kills survived (each counted when the test saw it happen),
// and allocations lost or doubled (must be 0).
// Details are results; Checks says, for a detail recorded with exact or
// atLeast (figures_test.go), what the test asserted of it; Params are the
// settings the run used (a seed, a deadline), not results.
type Figures struct {
	Category string            `json:"category"`
	Cases    int               `json:"cases"`
	Faults   int               `json:"faults,omitempty"`
	Kills    int               `json:"kills,omitempty"`
	Lost     int               `json:"lost"`
	Doubled  int               `json:"doubled"`
	Details  map[string]any    `json:"details,omitempty"`
	Checks   map[string]string `json:"checks,omitempty"`
	Params   map[string]any    `json:"params,omitempty"`
	Elapsed  string            `json:"elapsed"`
	When     time.Time         `json:"when"`
	// Skipped says why the category did not run; nothing else is set then.
	Skipped string `json:"skipped,omitempty"`
}

var reportMu sync.Mutex

// record appends f to the -report file (when set) and logs it. Lost and
// doubled must be 0: record asserts it.
func record(t *testing.T, f Figures) {
	t.Helper()
	assert.Zero(t, f.Lost, "%s: allocations lost", f.Category)
	assert.Zero(t, f.Doubled, "%s: devices doubled", f.Category)
	f.When = time.Now().UTC()
	b, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("figures: %s", b)
	if *report == "" {
		return
	}
	reportMu.Lock()
	defer reportMu.Unlock()
	file, err := os.OpenFile(*report, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	if _, err := file.Write(append(b, '\n')); err != nil {
		t.Fatal(err)
	}
}

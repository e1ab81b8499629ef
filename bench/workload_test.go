package main

import (
	"fmt"
	"os"
	"slices"
	"testing"

	"github.com/go-logr/logr"
)

// Every workload runs to completion against devmgr, with fewer repetitions
// than `bench run` makes, and reports the figures the report reads. The
// kubelet's side needs root and a private mount namespace (make
// bench-compare); devmgr's needs neither, so a change to the library that
// breaks the harness shows here rather than on the day of a comparison.
func TestWorkloadsRunAgainstDevmgr(t *testing.T) {
	cases := []struct {
		name string
		run  func(r *run) error
		want map[string]float64 // metric -> exact value, or positive
	}{
		{"W1", func(r *run) error { return r.w1(8) },
			map[string]float64{"message_bytes": positive, "register_ns": positive, "register_durable_ns": positive, "update_ns": positive, "update_durable_ns": positive}},
		{"W2", (*run).w2,
			map[string]float64{"total_ns": positive, "p50_ns": positive, "first100_mean_ns": positive, "last100_mean_ns": positive, "checkpoint_bytes": positive}},
		{"W3", func(r *run) error { return r.w3(1000, 3, false, statesRandom, 1) },
			map[string]float64{"visible_ns": positive, "durable_ns": positive, "unhealthy": 1000, "changed_mean": positive, "held_changed_mean": positive}},
		{"W3direct", func(r *run) error { return r.w3(0, 3, true, statesRandom, 1) },
			map[string]float64{"call_ns": positive, "unhealthy": 1000, "changed_mean": positive}},
		{"W3alternating", func(r *run) error { return r.w3(0, 3, false, statesAlternating, 1) },
			map[string]float64{"visible_ns": positive, "durable_ns": positive, "unhealthy": 1000, "changed_mean": 1000}},
		{"W3directalternating", func(r *run) error { return r.w3(0, 3, true, statesAlternating, 1) },
			map[string]float64{"call_ns": positive, "unhealthy": 1000, "changed_mean": 1000}},
		{"W4", func(r *run) error {
			if err := r.w4prep(); err != nil {
				return err
			}
			r.stop()
			return r.w4()
		}, map[string]float64{"checkpoint_bytes": positive, "start_ns": positive, "restored_pods": 1000}},
		{"W5", func(r *run) error { return r.w5(2) },
			map[string]float64{"pods_per_s": positive, "errors": 0, "missing": 0, "duplicates": 0}},
		{"W6", func(r *run) error { return r.w6(5) },
			map[string]float64{"call_ns": positive, "hints": positive}},
		{"W3wire", func(r *run) error { return r.w3wire(2, 1) },
			map[string]float64{"visible_ns": positive}},
		{"floor", func(r *run) error { return r.floor(64<<10, 3) },
			map[string]float64{"write_ns": positive, "bytes": 64 << 10}},
		{"floorgrow", func(r *run) error { return r.floorGrow(64<<10, 200) },
			map[string]float64{"first100_ns": positive, "last100_ns": positive, "bytes": 64 << 10}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// Unix socket paths must stay short: not under t.TempDir().
			dir, err := os.MkdirTemp("", "bench")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = os.RemoveAll(dir) })
			sink := &errorSink{}
			r := &run{impl: "devmgr", dir: dir, log: logr.New(sink), sink: sink,
				res: result{Impl: "devmgr", Workload: c.name, Metrics: map[string]float64{}}}
			err = c.run(r)
			r.stop()
			if err != nil {
				t.Fatalf("%s: %v (first error logged: %q)", c.name, err, sink.first())
			}
			for name, want := range c.want {
				got, ok := r.res.Metrics[name]
				switch {
				case !ok:
					t.Errorf("%s reported no %s; it reported %v", c.name, name, r.res.Metrics)
				case want == positive && got <= 0, want != positive && got != want:
					t.Errorf("%s: %s = %v, want %v", c.name, name, got, wantText(want))
				}
			}
		})
	}
}

// positive, as a wanted metric, stands for any positive value.
const positive = -1

func wantText(v float64) any {
	if v == positive {
		return "a positive value"
	}
	return v
}

// W3's random updates: the same seed gives both implementations the same
// sequence, another seed another; every update marks a fresh tenth of the
// devices unhealthy, 1,000 and 900 (of 10,000) in turn so that allocatable
// changes with each, and no state of a run comes back.
func TestW3RandomUpdatesRepeatNoState(t *testing.T) {
	const n, iters = 10000, 20
	a, err := unhealthySets(n, iters, statesRandom, 7)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := unhealthySets(n, iters, statesRandom, 7)
	c, _ := unhealthySets(n, iters, statesRandom, 8)
	if !slices.EqualFunc(a, b, slices.Equal) {
		t.Error("the same seed gave two sequences")
	}
	if slices.Equal(a[0], c[0]) {
		t.Error("seeds 7 and 8 gave the same first update")
	}
	seen := map[string]int{}
	for u, set := range a {
		want := 1000
		if u%2 == 1 {
			want = 900
		}
		if len(set) != want {
			t.Errorf("update %d marks %d devices unhealthy, want %d", u, len(set), want)
		}
		distinct := map[int]bool{}
		for _, i := range set {
			if i < 0 || i >= n {
				t.Fatalf("update %d names device %d of %d", u, i, n)
			}
			distinct[i] = true
		}
		if len(distinct) != len(set) {
			t.Errorf("update %d names a device twice", u)
		}
		key := fmt.Sprint(set)
		if v, ok := seen[key]; ok {
			t.Errorf("update %d repeats the state of update %d", u, v)
		}
		seen[key] = u
	}
}

// The alternating sequence has two states: the first tenth unhealthy, then
// every device healthy.
func TestW3AlternatingUpdatesFlipTheSameTenth(t *testing.T) {
	sets, err := unhealthySets(100, 4, statesAlternating, 1)
	if err != nil {
		t.Fatal(err)
	}
	first := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}
	for u, set := range sets {
		want := first
		if u%2 == 1 {
			want = nil
		}
		if !slices.Equal(set, want) {
			t.Errorf("update %d: %v, want %v", u, set, want)
		}
	}
	if _, err := unhealthySets(100, 4, "moving", 1); err == nil {
		t.Error("an unknown -states was accepted")
	}
}

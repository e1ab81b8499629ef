package main

import (
	"os"
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
		{"W3", func(r *run) error { return r.w3(1000, 2, false, false) },
			map[string]float64{"visible_ns": positive, "durable_ns": positive, "flipped": 1000}},
		{"W3direct", func(r *run) error { return r.w3(0, 2, true, false) },
			map[string]float64{"call_ns": positive, "flipped": 1000}},
		{"W3moving", func(r *run) error { return r.w3(0, 3, false, true) },
			map[string]float64{"visible_ns": positive, "durable_ns": positive, "flipped": 1000}},
		{"W3directmoving", func(r *run) error { return r.w3(0, 3, true, true) },
			map[string]float64{"call_ns": positive, "flipped": 1000}},
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
		{"W3wire", func(r *run) error { return r.w3wire(2) },
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

package main

import (
	"strings"
	"testing"
	"time"
)

// fullReport returns a report of runs runs of every job and floor, with
// made-up figures: devmgr at a hundredth of the kubelet's times, the kubelet
// refusing 100,000 devices and crashing with two goroutines, as it does.
func fullReport(runs int) *report {
	r := &report{command: "cd bench && go run . compare -runs 9", machine: machine{CPUs: 2, Commit: "abc1234"},
		started: time.Now(), elapsed: time.Minute, runs: runs, impls: []string{"devmgr", "kubelet"},
		results: map[string]map[string][]result{}, prep: map[string]result{}, floorLen: 800 << 10,
		poll: 10 * time.Microsecond, pin: true, seed: 1, binaries: binaryInfo{one: 50 << 20}}
	metrics := map[string]float64{
		"register_ns": 1e7, "update_ns": 1e7, "first_list_ns": 5e6, "message_bytes": 5e5, "p50_ns": 2e6, "p99_ns": 4e6,
		"first100_mean_ns": 1.5e6, "last100_mean_ns": 2.5e6, "total_ns": 2e9, "first100_bytes": 8e4, "last100_bytes": 7.8e5,
		"visible_ns": 3e6, "durable_ns": 4e6, "call_ns": 1.5e6, "changed_mean": 1710, "held_changed_mean": 171,
		"start_ns": 3e7, "pods_per_s": 500, "errors": 0, "missing": 0, "duplicates": 0,
	}
	for _, j := range jobs {
		for _, impl := range r.impls {
			for i := range runs {
				res := result{Impl: impl, Workload: j.workload, Status: statusOK, PeakRSS: 60 << 10, Metrics: map[string]float64{}}
				for k, v := range metrics {
					if impl == "kubelet" && k != "pods_per_s" && strings.HasSuffix(k, "_ns") {
						v *= 100
					}
					if j.name() == "W5/g=2" && k == "pods_per_s" {
						v *= 1.7
					}
					res.Metrics[k] = v * (1 + float64(i)/100)
				}
				if impl == "kubelet" {
					res.PeakRSS = 70 << 10
					switch j.name() {
					case "W1/n=100000":
						res.Status, res.Note = statusRefused, "grpc: received message larger than max"
					case "W5/g=2":
						res.Status, res.Note = statusCrashed, "fatal error: concurrent map writes"
					}
				}
				r.results[j.name()] = appendResult(r.results[j.name()], res)
			}
		}
	}
	for i := range runs {
		for _, f := range []struct {
			job, impl string
			m         map[string]float64
		}{
			{"floor", "disk", map[string]float64{"write_ns": 1.8e6, "bytes": 8e5}},
			{"floor/first100", "disk", map[string]float64{"write_ns": 8e5, "bytes": 8e4}},
			{"floor/last100", "disk", map[string]float64{"write_ns": 1.8e6, "bytes": 7.8e5}},
			{"floorgrow", "disk", map[string]float64{"first100_ns": 9e5, "last100_ns": 1.9e6, "bytes": 8e5}},
			{"W3wire", "wire", map[string]float64{"visible_ns": 2e6 * (1 + float64(i)/100)}},
		} {
			r.results[f.job] = appendResult(r.results[f.job], result{Impl: f.impl, Status: statusOK, Metrics: f.m})
		}
	}
	for _, impl := range r.impls {
		r.prep[impl] = result{Impl: impl, Status: statusOK, Metrics: map[string]float64{"checkpoint_bytes": 8e5}}
	}
	return r
}

func appendResult(m map[string][]result, res result) map[string][]result {
	if m == nil {
		m = map[string][]result{}
	}
	m[res.Impl] = append(m[res.Impl], res)
	return m
}

// The generated report stays under 200 lines with every workload, floor and
// a refusal and a crash in it, and judges every target.
func TestReportIsShortAndJudgesEveryTarget(t *testing.T) {
	text := fullReport(9).markdown()
	if n := strings.Count(text, "\n"); n >= 200 {
		t.Errorf("the report has %d lines, want under 200", n)
	}
	for _, want := range []string{"## Machine", "## How to reproduce", "## Results", "## Targets", "## Floors",
		"](../bench/README.md)", "W3 alternating", "refused 9/9", "crashed 9/9", "12 of 12 targets met"} {
		if !strings.Contains(text, want) {
			t.Errorf("the report does not contain %q", want)
		}
	}
	for _, gone := range []string{"spare", "RENAME_EXCHANGE", "moving", "Every run"} {
		if strings.Contains(text, gone) {
			t.Errorf("the report still contains %q", gone)
		}
	}
	if t.Failed() {
		t.Log(text)
	}
}

// A target's figure is printed with the digits it takes to show on which
// side of the limit it is.
func TestAgainstLimitNeverPrintsAMissAsTheLimit(t *testing.T) {
	for _, c := range []struct {
		x, limit float64
		atMost   bool
		want     string
	}{
		{0.30031, 0.3, true, "0.3003"},
		{0.29991, 0.3, true, "0.3"},
		{0.0632, 0.25, true, "0.0632"},
		{1.49996, 1.5, false, "1.49996"},
		{2.2345, 1.5, false, "2.23"},
	} {
		if got := againstLimit(c.x, c.limit, c.atMost); got != c.want {
			t.Errorf("againstLimit(%v, %v, %v) = %q, want %q", c.x, c.limit, c.atMost, got, c.want)
		}
	}
}

// Each target is judged against its own limit: a figure just past one
// misses it, and only that one.
func TestReportTargetsMissPastTheirLimit(t *testing.T) {
	r := fullReport(3)
	for i, res := range r.results["W3/pods=0"]["devmgr"] {
		res.Metrics["durable_ns"] = 0.81 * r.results["W3/pods=0"]["kubelet"][i].Metrics["durable_ns"]
	}
	// Just past 1.25x the growth of the writes alone (1.9/0.9).
	for _, res := range r.results["W2"]["devmgr"] {
		res.Metrics["last100_mean_ns"] = 1.26 * 1.9 / 0.9 * res.Metrics["first100_mean_ns"]
	}
	// The median of devmgr's three runs above the kubelet's 70 MiB.
	r.results["W6"]["devmgr"][0].PeakRSS = 71 << 10
	r.results["W6"]["devmgr"][1].PeakRSS = 71 << 10
	want := []string{"W2 devmgr's growth", "W3 0 pods, end to end", "Peak RSS"}
	var missed []string
	for _, v := range r.verdicts() {
		switch {
		case v.met == nil:
			t.Errorf("%q not judged", v.target)
		case !*v.met:
			missed = append(missed, v.target)
		}
	}
	if len(missed) != len(want) {
		t.Fatalf("missed %q, want the targets starting %q", missed, want)
	}
	for i, m := range missed {
		if !strings.HasPrefix(m, want[i]) {
			t.Errorf("missed %q, want the target starting %q", m, want[i])
		}
	}
}

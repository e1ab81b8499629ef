package main

import "testing"

func TestFormatNs(t *testing.T) {
	for ns, want := range map[float64]string{
		999_600:       "1 ms",
		999_400:       "999 µs",
		1_000:         "1 µs",
		999.9:         "1 µs",
		12_345_678:    "12.3 ms",
		1_234_567_890: "1.23 s",
		281:           "281 ns",
	} {
		if got := formatNs(ns); got != want {
			t.Errorf("formatNs(%v) = %q, want %q", ns, got, want)
		}
	}
}

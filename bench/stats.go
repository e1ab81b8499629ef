package main

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// median of durations; the mean of the middle two for an even count.
func median(d durations) time.Duration {
	f := make([]float64, len(d))
	for i, x := range d {
		f[i] = float64(x)
	}
	return time.Duration(medianOf(f))
}

// medianOf returns the median of xs, NaN for none.
func medianOf(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// spread is a set of per-run values of one metric.
type spread struct {
	values []float64
}

func (s spread) ok() bool      { return len(s.values) > 0 }
func (s spread) med() float64  { return medianOf(s.values) }
func (s spread) low() float64  { return slices.Min(s.values) }
func (s spread) high() float64 { return slices.Max(s.values) }

// formatNs prints nanoseconds with a unit that keeps three significant
// digits.
func formatNs(ns float64) string {
	// Round to the three digits shown first, so that 999.6 µs reads 1 ms,
	// not 1e+03 µs.
	ns, _ = strconv.ParseFloat(strconv.FormatFloat(ns, 'g', 3, 64), 64)
	switch d := math.Abs(ns); {
	case d >= 1e9:
		return fmt.Sprintf("%.3g s", ns/1e9)
	case d >= 1e6:
		return fmt.Sprintf("%.3g ms", ns/1e6)
	case d >= 1e3:
		return fmt.Sprintf("%.3g µs", ns/1e3)
	}
	return fmt.Sprintf("%.3g ns", ns)
}

// formatValue prints a metric value by its unit, taken from its name.
func formatValue(metric string, v float64) string {
	switch {
	case strings.HasSuffix(metric, "_ns"):
		return formatNs(v)
	case strings.HasSuffix(metric, "_per_s"):
		return fmt.Sprintf("%.0f/s", v)
	case metric == "bytes" || strings.HasSuffix(metric, "_bytes"):
		return formatBytes(v)
	}
	return fmt.Sprintf("%.4g", v)
}

func formatBytes(b float64) string {
	switch {
	case b >= 1<<20:
		return fmt.Sprintf("%.2f MiB", b/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.0f KiB", b/(1<<10))
	}
	return fmt.Sprintf("%.0f B", b)
}

func formatKiB(k float64) string { return fmt.Sprintf("%.0f MiB", k/1024) }

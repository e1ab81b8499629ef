package devicemanager

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// randomIDs returns n distinct IDs of the shape given, shuffled.
func randomIDs(r *rand.Rand, n int, shape func(r *rand.Rand) string) []string {
	seen := map[string]bool{}
	var out []string
	for len(out) < n {
		id := shape(r)
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}

// idShapes cover what decides the radix sort's work: a common prefix of
// any length (the whole of some IDs included), IDs shorter and longer than
// the 16-byte key after it, keys that tie and differ only later, NUL and
// high bytes (which padding must not confuse with a shorter ID), empty IDs.
var idShapes = map[string]func(r *rand.Rand) string{
	"gpu uuid": func(r *rand.Rand) string {
		return fmt.Sprintf("GPU-%08x-%04x-%04x-%04x-%012x", r.Uint32(), r.IntN(1<<16), r.IntN(1<<16), r.IntN(1<<16), r.Uint64()>>16)
	},
	"numbered": func(r *rand.Rand) string { return fmt.Sprintf("dev-%d", r.IntN(1<<20)) },
	"long shared prefix": func(r *rand.Rand) string {
		return "nvidia.com/gpu-0000000000000000000000-" + fmt.Sprint(r.IntN(1<<20))
	},
	"keys tie, IDs differ later": func(r *rand.Rand) string {
		return fmt.Sprintf("%c-0000000000000000000000-%d", 'a'+r.IntN(3), r.IntN(1<<20))
	},
	"some IDs are the prefix of others": func(r *rand.Rand) string {
		return strings.Repeat("a", r.IntN(40))
	},
	"any bytes": func(r *rand.Rand) string {
		b := make([]byte, r.IntN(24))
		for i := range b {
			b[i] = []byte{0, 1, 'a', 0x7f, 0x80, 0xff}[r.IntN(6)]
		}
		return string(b)
	},
}

// sortByID orders IDs as strings.Compare does, with each ID's index, for
// lists below and above radixMin, whatever their shape.
func TestSortByIDMatchesComparisonSort(t *testing.T) {
	r := rand.New(rand.NewPCG(51, 52))
	for name, shape := range idShapes {
		for _, n := range []int{1, 2, radixMin - 1, radixMin, 3000} {
			t.Run(fmt.Sprintf("%s/%d", name, n), func(t *testing.T) {
				if name == "some IDs are the prefix of others" {
					n = min(n, 40) // only 40 such IDs exist
				}
				ids := randomIDs(r, n, shape)
				want := slices.Clone(ids)
				slices.Sort(want)
				order, got := sortByID(deviceIDs(devicesWithIDs(ids)))
				require.Equal(t, want, got)
				for k, i := range order {
					require.Equal(t, got[k], ids[i], "index %d", k)
				}
				// A list in order already keeps its order.
				order, got = sortByID(deviceIDs(devicesWithIDs(want)))
				require.Equal(t, want, got)
				for k, i := range order {
					require.Equal(t, int32(k), i)
				}
			})
		}
	}
	// Duplicates (which a list applied in place never has) still come out in
	// order, each with an index of its ID.
	ids := append(randomIDs(r, 500, idShapes["numbered"]), randomIDs(r, 500, idShapes["numbered"])...)
	order, got := sortByID(deviceIDs(devicesWithIDs(ids)))
	require.True(t, slices.IsSorted(got))
	for k, i := range order {
		require.Equal(t, got[k], ids[i])
	}
}

// BenchmarkSortByID sorts the IDs of 10,000 GPU-style devices, as for a
// plugin's first list.
func BenchmarkSortByID(b *testing.B) {
	ids := randomIDs(rand.New(rand.NewPCG(53, 54)), 10000, idShapes["gpu uuid"])
	list := devicesWithIDs(ids)
	b.ReportAllocs()
	for b.Loop() {
		sortByID(deviceIDs(list))
	}
}

func devicesWithIDs(ids []string) []*pluginapi.Device {
	out := make([]*pluginapi.Device, len(ids))
	for i, id := range ids {
		out[i] = &pluginapi.Device{ID: id, Health: pluginapi.Healthy}
	}
	return out
}

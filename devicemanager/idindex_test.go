package devicemanager

import (
	"fmt"
	"math/rand/v2"
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// TestIndexListMatchesMap checks indexList against a map built the plain
// way: nils dropped, each ID's last device kept where it was last listed,
// every ID found at its position and no other ID found, for lists with and
// without repeats, of sizes around the table's growth points.
func TestIndexListMatchesMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 5, 6, 7, 12, 13, 100, 767, 768, 769, 5000} {
		for _, repeats := range []bool{false, true} {
			t.Run(fmt.Sprintf("n=%d,repeats=%v", n, repeats), func(t *testing.T) {
				var devs []*pluginapi.Device
				for i := range n {
					id := fmt.Sprintf("dev-%d", i)
					if repeats && i > 0 && rng.IntN(4) == 0 {
						id = fmt.Sprintf("dev-%d", rng.IntN(i))
					}
					devs = append(devs, &pluginapi.Device{ID: id, Health: fmt.Sprint(i)})
					if rng.IntN(10) == 0 {
						devs = append(devs, nil)
					}
				}
				// The model: the last device listed under each ID, kept
				// where that last listing is.
				last := map[string]int{}
				for i, d := range devs {
					if d != nil {
						last[d.ID] = i
					}
				}
				var want []*pluginapi.Device
				for i, d := range devs {
					if d != nil && last[d.ID] == i {
						want = append(want, d)
					}
				}
				index, list := indexList(devs)
				if len(list) != len(want) {
					t.Fatalf("%d devices kept, want %d", len(list), len(want))
				}
				for p, d := range want {
					if list[p] != d {
						t.Fatalf("position %d holds %v, want %v", p, list[p], d)
					}
					if q, ok := index.find(list, d.ID); !ok || q != int32(p) {
						t.Fatalf("find(%s) = %d, %v; want %d", d.ID, q, ok, p)
					}
				}
				for i := range 200 {
					id := fmt.Sprintf("absent-%d", i)
					if q, ok := index.find(list, id); ok {
						t.Fatalf("find(%s) = %d, want absent", id, q)
					}
				}
			})
		}
	}
	var empty idIndex
	if _, ok := empty.find(nil, "dev-0"); ok {
		t.Fatal("the zero index finds an ID")
	}
}

// TestSlotCountKeepsASlotFree checks that every table has room: at most
// three slots in four used, a power of two.
func TestSlotCountKeepsASlotFree(t *testing.T) {
	for n := range 5000 {
		size := slotCount(n)
		if size&(size-1) != 0 || size*3 < n*4 || size < 8 {
			t.Fatalf("slotCount(%d) = %d", n, size)
		}
		if size > 8 && (size/2)*3 >= n*4 {
			t.Fatalf("slotCount(%d) = %d, half would do", n, size)
		}
	}
}

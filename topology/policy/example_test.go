package policy_test

import (
	"errors"
	"fmt"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/openkubelet/devmgr/topology"
	"github.com/openkubelet/devmgr/topology/policy"
)

// staticHints is a HintProvider giving the same hints for every container,
// standing in for the device manager or a CPU manager.
type staticHints map[string][]topology.Hint

func (s staticHints) GetTopologyHints(*v1.Pod, *v1.Container) map[string][]topology.Hint { return s }

func nodes(ids ...int) *topology.BitMask {
	m, err := topology.NewBitMask(ids...)
	if err != nil {
		panic(err)
	}
	return &m
}

// The same hints under each policy: a GPU fits on either node of a
// two-node machine, but the container's NIC is bonded across both nodes.
func ExampleNew() {
	hints := []map[string][]topology.Hint{
		{"vendor.com/gpu": {{NUMANodeAffinity: nodes(0), Preferred: true}, {NUMANodeAffinity: nodes(1), Preferred: true}, {NUMANodeAffinity: nodes(0, 1)}}},
		{"vendor.com/nic": {{NUMANodeAffinity: nodes(0, 1), Preferred: true}}},
	}
	for _, name := range []string{policy.None, policy.BestEffort, policy.Restricted, policy.SingleNUMANode} {
		p, err := policy.New(name, []int{0, 1})
		if err != nil {
			panic(err)
		}
		best, admit := p.Merge(hints)
		fmt.Printf("%s: %v admit=%t\n", name, best, admit)
	}
	// Output:
	// none: {<nil> false} admit=true
	// best-effort: {11 false} admit=true
	// restricted: {11 false} admit=false
	// single-numa-node: {<nil> false} admit=false
}

// A Store admits containers under a policy and is the device manager's
// AffinityStore (devicemanager.Options.AffinityStore), so allocation follows
// the chosen nodes.
func ExampleStore_Admit() {
	gpus := staticHints{"vendor.com/gpu": {{NUMANodeAffinity: nodes(0), Preferred: true}, {NUMANodeAffinity: nodes(1), Preferred: true}, {NUMANodeAffinity: nodes(0, 1)}}}
	cpus := staticHints{"cpu": {{NUMANodeAffinity: nodes(1), Preferred: true}, {NUMANodeAffinity: nodes(0, 1)}}}
	wideCPUs := staticHints{"cpu": {{NUMANodeAffinity: nodes(0, 1), Preferred: true}}}

	restricted, err := policy.New(policy.Restricted, []int{0, 1})
	if err != nil {
		panic(err)
	}
	store := policy.NewStore()
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "pod-1"}}

	best, err := store.Admit(restricted, pod, &v1.Container{Name: "app"}, gpus, cpus)
	fmt.Println("app:", best, err)
	fmt.Println("the device manager reads:", store.GetAffinity("pod-1", "app").NUMANodeAffinity.GetBits())

	_, err = store.Admit(restricted, pod, &v1.Container{Name: "wide"}, gpus, wideCPUs)
	var refused *policy.AffinityError
	if errors.As(err, &refused) {
		fmt.Printf("wide: %v (best was %v)\n", err, refused.Hint)
	}
	fmt.Println("recorded for wide:", store.GetAffinity("pod-1", "wide"))

	store.RemovePod("pod-1")
	fmt.Println("after RemovePod:", store.GetAffinity("pod-1", "app"))
	// Output:
	// app: {10 true} <nil>
	// the device manager reads: [1]
	// wide: Resources cannot be allocated with Topology locality (best was {11 false})
	// recorded for wide: {<nil> false}
	// after RemovePod: {<nil> false}
}

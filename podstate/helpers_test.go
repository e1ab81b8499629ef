package podstate

import (
	"cmp"
	"slices"

	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/topology"
)

// respOpt shapes a ContainerAllocateResponse in tests.
type respOpt func(*pluginapi.ContainerAllocateResponse)

func newResp(opts ...respOpt) *pluginapi.ContainerAllocateResponse {
	r := &pluginapi.ContainerAllocateResponse{}
	for _, o := range opts {
		o(r)
	}
	return r
}

func withEnvs(kv ...string) respOpt {
	return func(r *pluginapi.ContainerAllocateResponse) {
		if r.Envs == nil {
			r.Envs = map[string]string{}
		}
		for i := 0; i+1 < len(kv); i += 2 {
			r.Envs[kv[i]] = kv[i+1]
		}
	}
}

func withAnnotations(kv ...string) respOpt {
	return func(r *pluginapi.ContainerAllocateResponse) {
		if r.Annotations == nil {
			r.Annotations = map[string]string{}
		}
		for i := 0; i+1 < len(kv); i += 2 {
			r.Annotations[kv[i]] = kv[i+1]
		}
	}
}

// withDevices adds device specs given as container path, host path pairs.
func withDevices(pairs ...string) respOpt {
	return func(r *pluginapi.ContainerAllocateResponse) {
		for i := 0; i+1 < len(pairs); i += 2 {
			r.Devices = append(r.Devices, &pluginapi.DeviceSpec{
				ContainerPath: pairs[i], HostPath: pairs[i+1], Permissions: "mrw",
			})
		}
	}
}

// withMounts adds read-only mounts given as container path, host path pairs.
func withMounts(pairs ...string) respOpt {
	return func(r *pluginapi.ContainerAllocateResponse) {
		for i := 0; i+1 < len(pairs); i += 2 {
			r.Mounts = append(r.Mounts, &pluginapi.Mount{
				ContainerPath: pairs[i], HostPath: pairs[i+1], ReadOnly: true,
			})
		}
	}
}

func withCDI(names ...string) respOpt {
	return func(r *pluginapi.ContainerAllocateResponse) {
		for _, n := range names {
			r.CdiDevices = append(r.CdiDevices, &pluginapi.CDIDevice{Name: n})
		}
	}
}

// numaDev is a device on the given NUMA nodes (none: no topology).
func numaDev(id string, nodes ...int64) *pluginapi.Device {
	d := &pluginapi.Device{ID: id, Health: pluginapi.Healthy}
	if len(nodes) > 0 {
		d.Topology = &pluginapi.TopologyInfo{}
		for _, n := range nodes {
			d.Topology.Nodes = append(d.Topology.Nodes, &pluginapi.NUMANode{ID: n})
		}
	}
	return d
}

// tiersFor is a small stand-in for topology.Census.Tiers:
// nodes of the hint first, then the others, then "no topology"; within a
// group by ascending count of available devices (then node id); each device
// goes to the first node in that order that holds it. A nil hint puts every
// available device under NoTopology.
func tiersFor(devs DeviceInstances, available sets.Set[string], hint []int64) topology.Tiers {
	if hint == nil {
		return topology.Tiers{NoTopology: sets.List(available)}
	}
	perNode := map[int64][]string{}
	for _, id := range sets.List(available) {
		nodes := nodesOf(devs[id])
		if len(nodes) == 0 {
			nodes = []int64{NoTopology}
		}
		for _, n := range nodes {
			perNode[n] = append(perNode[n], id)
		}
	}
	inHint := sets.New(hint...)
	rank := func(n int64) int {
		switch {
		case n == NoTopology:
			return 2
		case inHint.Has(n):
			return 0
		}
		return 1
	}
	order := make([]int64, 0, len(perNode))
	for n := range perNode {
		order = append(order, n)
	}
	slices.SortFunc(order, func(a, b int64) int {
		return cmp.Or(cmp.Compare(rank(a), rank(b)), cmp.Compare(len(perNode[a]), len(perNode[b])), cmp.Compare(a, b))
	})
	var t topology.Tiers
	placed := sets.New[string]()
	for _, n := range order {
		for _, id := range perNode[n] {
			if placed.Has(id) {
				continue
			}
			placed.Insert(id)
			addTier(&t, rank(n), id)
		}
	}
	return t
}

// addTier appends id to tier 0 (Aligned), 1 (Unaligned) or any other
// (NoTopology) of t.
func addTier(t *topology.Tiers, tier int, id string) {
	switch tier {
	case 0:
		t.Aligned = append(t.Aligned, id)
	case 1:
		t.Unaligned = append(t.Unaligned, id)
	default:
		t.NoTopology = append(t.NoTopology, id)
	}
}

// devices returns, per resource with at least one record, the union of the
// recorded device IDs (pending reservations excluded). Unlike upstream, a
// record without a response contributes its IDs too: its devices are in use.
func (l *Ledger) devices() map[string]sets.Set[string] {
	out := make(map[string]sets.Set[string])
	for uid, ctrs := range l.pods {
		for name := range ctrs {
			l.AddContainerDevices(uid, name, out)
		}
	}
	return out
}

package podstate

import (
	"slices"

	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/openkubelet/devmgr/topology"
)

// SelectInput is what the kubelet's device selection works from. Build
// and use it under the caller's lock (Available may be a view of the
// caller's state); it is not modified.
type SelectInput struct {
	Resource string // for error messages
	Required int    // the container's full request for the resource
	Needed   int    // devices still to pick (Required minus those already held)
	// Reusable is the reuse pool for the resource, in the order to take it
	// (sort it for determinism). Its devices are taken first, unchecked.
	Reusable []string
	// Available: healthy devices that no record or reservation holds. The
	// selection asks it Len, and Has for the devices of the tiers it walks,
	// so a caller with tens of thousands of devices need not build the set
	// for each admission. The plugin's query lists every available device:
	// from the set itself when it is a sets.Set, else from the tiers, which
	// must then cover it.
	Available DeviceSet
	// Tiers cover Available, each tier in preference order; IDs outside
	// Available are ignored, so that without an affinity NoTopology can be
	// every healthy device in ID order, kept by the caller, instead of a
	// list of the free ones built for each admission.
	Tiers topology.Tiers
}

// PreferredQuery is the plugin's GetPreferredAllocation request for one
// container: sorted IDs, and Size the full request.
type PreferredQuery struct {
	Available   []string
	MustInclude []string
	Size        int
}

// selection is the state of one run of the selection rules.
type selection struct {
	in     SelectInput
	picked []string
	has    sets.Set[string]
	needed int
	// free: Available minus picked reusable devices, the snapshot of step 7b.
	free DeviceSet
	// aligned: the aligned tier restricted to free, without duplicates;
	// with askFirst, only its first Needed+1 devices.
	aligned []string
	// askFirst: step 7d (the plugin chooses among aligned devices) rather than
	// 7e (all aligned devices taken, the plugin chooses among the rest).
	askFirst bool
}

// minus is a DeviceSet less some of its IDs.
type minus struct {
	set  DeviceSet
	gone sets.Set[string]
	n    int
}

// without returns set less the IDs of gone: a new set when set is a
// sets.Set, else a view of it.
func without(set DeviceSet, gone sets.Set[string]) DeviceSet {
	if s, ok := set.(sets.Set[string]); ok {
		return s.Difference(gone)
	}
	n := set.Len()
	for id := range gone {
		if set.Has(id) {
			n--
		}
	}
	return minus{set: set, gone: gone, n: n}
}

func (m minus) Len() int           { return m.n }
func (m minus) Has(id string) bool { return !m.gone.Has(id) && m.set.Has(id) }

// take picks, in order, the IDs of ids that pass ok and are not yet picked,
// until nothing is needed. It reports whether nothing is needed any more.
func (s *selection) take(ids []string, ok func(string) bool) bool {
	for _, id := range ids {
		if s.needed <= 0 {
			break
		}
		if s.has.Has(id) || (ok != nil && !ok(id)) {
			continue
		}
		s.picked = append(s.picked, id)
		s.has.Insert(id)
		s.needed--
	}
	return s.needed <= 0
}

// start runs the selection rules up to the point where the plugin's
// preference is needed. done reports that the picks are complete without it.
func start(in SelectInput) (s *selection, done bool, err error) {
	s = &selection{in: in, has: sets.New[string](), needed: in.Needed}
	if s.needed <= 0 || s.take(in.Reusable, nil) {
		return s, true, nil
	}
	// free is only read: Available itself, less the reused devices, not a
	// copy of a set as large as the node's free devices. A nil Available
	// is empty.
	s.free = in.Available
	if s.free == nil {
		s.free = sets.Set[string](nil)
	}
	if s.has.Len() > 0 {
		s.free = without(s.free, s.has)
	}
	if s.free.Len() < s.needed {
		return nil, false, admissionErrorf(ErrInsufficientDevices,
			"requested number of devices unavailable for %s. Requested: %d, Available: %d", in.Resource, s.needed, s.free.Len())
	}
	// The free aligned devices only until they outnumber the need: then
	// the plugin chooses among them, or the first are taken, and a tier of
	// tens of thousands costs a few steps.
	s.aligned = s.freeAligned(s.needed + 1)
	if len(s.aligned) > s.needed {
		s.askFirst = true
		return s, false, nil
	}
	return s, s.take(s.aligned, nil), nil
}

// freeAligned returns the free aligned devices, each once, in order: the
// first limit of them, or all when limit is negative.
func (s *selection) freeAligned(limit int) []string {
	tier := s.in.Tiers.Aligned
	var out []string
	if limit < 0 && slices.IsSorted(tier) {
		// All of a tier in ID order (one NUMA node's devices, as the
		// caller lists them): repeats are neighbours, and tens of
		// thousands of IDs need no set to be told apart.
		for i, id := range tier {
			if (i == 0 || tier[i-1] != id) && s.free.Has(id) {
				out = append(out, id)
			}
		}
		return out
	}
	seen := sets.New[string]()
	for _, id := range tier {
		if len(out) == limit {
			break
		}
		if s.free.Has(id) && !seen.Has(id) {
			seen.Insert(id)
			out = append(out, id)
		}
	}
	return out
}

// freeAlignedSorted returns every free aligned device once, in ID order.
func (s *selection) freeAlignedSorted() []string {
	free := s.freeAligned(-1)
	if !slices.IsSorted(free) {
		slices.Sort(free)
	}
	return free
}

// isFreeAligned returns a test of membership in the free aligned devices,
// for the few IDs of the plugin's preference: a binary search when the
// aligned tier is in ID order, else a set of them.
func (s *selection) isFreeAligned() func(string) bool {
	if tier := s.in.Tiers.Aligned; slices.IsSorted(tier) {
		return func(id string) bool {
			_, found := slices.BinarySearch(tier, id)
			return found && s.free.Has(id)
		}
	}
	return sets.New(s.freeAligned(-1)...).Has
}

// query is the plugin request at the current point: the candidates plus
// everything picked so far, which the plugin must include.
func (s *selection) query() PreferredQuery {
	q := PreferredQuery{MustInclude: sets.List(s.has), Size: s.in.Required}
	switch set, isSet := s.free.(sets.Set[string]); {
	case s.askFirst:
		q.Available = union(q.MustInclude, s.freeAlignedSorted())
	case isSet:
		q.Available = sets.List(s.has.Union(set))
	default:
		// Every free device, found in the tiers that cover it. Without an
		// affinity they are one tier in ID order, and so is this list: no
		// set of tens of thousands of IDs to build, and no sort.
		free := make([]string, 0, s.free.Len())
		for _, tier := range [][]string{s.in.Tiers.Aligned, s.in.Tiers.Unaligned, s.in.Tiers.NoTopology} {
			for _, id := range tier {
				if s.free.Has(id) {
					free = append(free, id)
				}
			}
		}
		if !slices.IsSorted(free) {
			slices.Sort(free)
		}
		q.Available = union(q.MustInclude, slices.Compact(free))
	}
	return q
}

// union returns the sorted union of a and b, two sorted lists without
// duplicates.
func union(a, b []string) []string {
	out := make([]string, 0, len(a)+len(b))
	for len(a) > 0 && len(b) > 0 {
		switch {
		case a[0] < b[0]:
			out, a = append(out, a[0]), a[1:]
		case a[0] > b[0]:
			out, b = append(out, b[0]), b[1:]
		default:
			out, a, b = append(out, a[0]), a[1:], b[1:]
		}
	}
	return append(append(out, a...), b...)
}

// PreferredQueryFor returns the GetPreferredAllocation request that Select
// would use the answer to, and false when Select will not consult the plugin
// (nothing to pick, the reuse pool or the aligned tier covers the request, or
// too few devices are available).
func PreferredQueryFor(in SelectInput) (PreferredQuery, bool) {
	s, done, err := start(in)
	if err != nil || done {
		return PreferredQuery{}, false
	}
	return s.query(), true
}

// Select picks the devices for one container and resource, as the kubelet does,
// and returns them sorted; nil when nothing is needed. preferred is the
// plugin's answer to PreferredQueryFor(in) (nil if the plugin was not asked);
// IDs in it that are not candidates are ignored.
//
// The rules: take from Reusable; fail with ErrInsufficientDevices when
// fewer than the remaining need are available; if the need is strictly below
// the number of aligned devices, take preferred aligned devices, then other
// aligned ones; otherwise take every aligned device, then preferred available
// ones, then Unaligned, then NoTopology. Running out of candidates fails with
// ErrAllocationShortfall. Select is pure: on error nothing has been picked anywhere.
func Select(in SelectInput, preferred []string) ([]string, error) {
	s, done, err := start(in)
	if err != nil {
		return nil, err
	}
	if !done {
		if s.askFirst {
			if len(preferred) > 0 {
				done = s.take(preferred, s.isFreeAligned())
			}
			// Then aligned devices in order: s.aligned holds the first
			// Needed+1, and the preference took at most as many of them as
			// it took devices, so they hold what is left to take.
			done = done || s.take(s.aligned, nil)
		} else {
			done = s.take(preferred, s.free.Has) ||
				s.take(in.Tiers.Unaligned, s.free.Has) ||
				s.take(in.Tiers.NoTopology, s.free.Has)
		}
	}
	if !done {
		return nil, admissionErrorf(ErrAllocationShortfall,
			"unexpectedly allocated less resources than required. Requested: %d, Got: %d", in.Required, in.Required-s.needed)
	}
	if len(s.picked) == 0 {
		return nil, nil
	}
	slices.Sort(s.picked)
	return s.picked, nil
}

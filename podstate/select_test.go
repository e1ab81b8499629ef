package podstate

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/openkubelet/devmgr/topology"
)

func TestSelectRules(t *testing.T) {
	six := sets.New("a1", "a2", "a3", "u1", "u2", "n1")
	tiers := topology.Tiers{Aligned: []string{"a1", "a2", "a3"}, Unaligned: []string{"u1", "u2"}, NoTopology: []string{"n1"}}
	cases := []struct {
		name      string
		in        SelectInput
		preferred []string
		wantQuery *PreferredQuery // nil: the plugin is not asked
		want      []string
		wantErr   string
		wantIs    error
	}{
		{name: "nothing needed",
			in:   SelectInput{Required: 0, Needed: 0, Available: six, Tiers: tiers},
			want: nil},
		{name: "reuse pool covers the need, taken in the given order",
			in:   SelectInput{Required: 2, Needed: 2, Reusable: []string{"r2", "r1", "r3"}, Available: six, Tiers: tiers},
			want: []string{"r1", "r2"}},
		{name: "reuse pool devices are taken even when not available",
			in:   SelectInput{Required: 1, Needed: 1, Reusable: []string{"r1"}, Available: sets.New[string]()},
			want: []string{"r1"}},
		{name: "too few available after reuse: remaining need and available count",
			in:      SelectInput{Resource: res1, Required: 4, Needed: 4, Reusable: []string{"r1"}, Available: sets.New("a1", "a2")},
			wantErr: "requested number of devices unavailable for domain1.com/resource1. Requested: 3, Available: 2",
			wantIs:  ErrInsufficientDevices},
		{name: "need below aligned count: plugin asked among aligned plus picked",
			in:        SelectInput{Required: 3, Needed: 3, Reusable: []string{"r1"}, Available: six, Tiers: tiers},
			preferred: []string{"a3", "u1", "r1"},
			wantQuery: &PreferredQuery{Available: []string{"a1", "a2", "a3", "r1"}, MustInclude: []string{"r1"}, Size: 3},
			want:      []string{"a1", "a3", "r1"}},
		{name: "need below aligned count: preferred order decides among aligned",
			in:        SelectInput{Required: 1, Needed: 1, Available: six, Tiers: tiers},
			preferred: []string{"a2", "a1"},
			wantQuery: &PreferredQuery{Available: []string{"a1", "a2", "a3"}, MustInclude: []string{}, Size: 1},
			want:      []string{"a2"}},
		{name: "need below aligned count: a single preferred aligned device is taken",
			in:        SelectInput{Required: 1, Needed: 1, Available: six, Tiers: tiers},
			preferred: []string{"a3"},
			wantQuery: &PreferredQuery{Available: []string{"a1", "a2", "a3"}, MustInclude: []string{}, Size: 1},
			want:      []string{"a3"}},
		{name: "need equals aligned count: all aligned, plugin not asked",
			in:   SelectInput{Required: 3, Needed: 3, Available: six, Tiers: tiers},
			want: []string{"a1", "a2", "a3"}},
		{name: "need above aligned count: aligned, then preferred among all available",
			in:        SelectInput{Required: 5, Needed: 5, Available: six, Tiers: tiers},
			preferred: []string{"n1", "bogus", "a1", "u2"},
			wantQuery: &PreferredQuery{
				Available:   []string{"a1", "a2", "a3", "n1", "u1", "u2"},
				MustInclude: []string{"a1", "a2", "a3"}, Size: 5},
			want: []string{"a1", "a2", "a3", "n1", "u2"}},
		{name: "need above aligned count, no preference: unaligned before no-topology",
			in:        SelectInput{Required: 5, Needed: 5, Available: six, Tiers: tiers},
			wantQuery: &PreferredQuery{Available: sets.List(six), MustInclude: []string{"a1", "a2", "a3"}, Size: 5},
			want:      []string{"a1", "a2", "a3", "u1", "u2"}},
		{name: "preference shorter than the need is filled from the tiers",
			in:        SelectInput{Required: 6, Needed: 6, Available: six, Tiers: tiers},
			preferred: []string{"n1"},
			wantQuery: &PreferredQuery{Available: sets.List(six), MustInclude: []string{"a1", "a2", "a3"}, Size: 6},
			want:      sets.List(six)},
		{name: "preference longer than the need: taken in preferred order",
			in:        SelectInput{Required: 4, Needed: 4, Available: six, Tiers: tiers},
			preferred: []string{"u2", "n1", "u1"},
			wantQuery: &PreferredQuery{Available: sets.List(six), MustInclude: []string{"a1", "a2", "a3"}, Size: 4},
			want:      []string{"a1", "a2", "a3", "u2"}},
		{name: "no affinity: everything in NoTopology, the plugin chooses",
			in: SelectInput{Required: 2, Needed: 2, Available: sets.New("x", "y", "z"),
				Tiers: topology.Tiers{NoTopology: []string{"z", "y", "x"}}},
			preferred: []string{"x"},
			wantQuery: &PreferredQuery{Available: []string{"x", "y", "z"}, MustInclude: []string{}, Size: 2},
			want:      []string{"x", "z"}},
		{name: "tier IDs outside Available are ignored",
			in: SelectInput{Required: 1, Needed: 1, Available: sets.New("x"),
				Tiers: topology.Tiers{Aligned: []string{"ghost", "ghost2"}, NoTopology: []string{"ghost", "x"}}},
			wantQuery: &PreferredQuery{Available: []string{"x"}, MustInclude: []string{}, Size: 1},
			want:      []string{"x"}},
		{name: "duplicate aligned IDs counted once",
			in: SelectInput{Required: 1, Needed: 1, Available: sets.New("x", "y"),
				Tiers: topology.Tiers{Aligned: []string{"x", "x"}, Unaligned: []string{"y"}}},
			want: []string{"x"}},
		{name: "an ID twice in a tier is asked about once",
			in: SelectInput{Required: 2, Needed: 2, Available: sets.New("x", "y", "z"),
				Tiers: topology.Tiers{Aligned: []string{"x", "x"}, Unaligned: []string{"z", "y"}}},
			wantQuery: &PreferredQuery{Available: []string{"x", "y", "z"}, MustInclude: []string{"x"}, Size: 2},
			want:      []string{"x", "z"}},
		{name: "the plugin chooses among aligned IDs listed twice, each asked about once",
			in: SelectInput{Required: 1, Needed: 1, Available: sets.New("a1", "a2", "a3", "u1"),
				Tiers: topology.Tiers{Aligned: []string{"a1", "a1", "a2", "a2", "a3"}, Unaligned: []string{"u1"}}},
			preferred: []string{"u1", "a2"},
			wantQuery: &PreferredQuery{Available: []string{"a1", "a2", "a3"}, MustInclude: []string{}, Size: 1},
			want:      []string{"a2"}},
		{name: "tiers not covering Available: shortfall with the kubelet's text",
			in: SelectInput{Resource: res1, Required: 3, Needed: 3, Available: sets.New("a1", "a2", "zz"),
				Tiers: topology.Tiers{Aligned: []string{"a1"}, Unaligned: []string{"a2"}}},
			wantQuery: &PreferredQuery{Available: []string{"a1", "a2", "zz"}, MustInclude: []string{"a1"}, Size: 3},
			wantErr:   "unexpectedly allocated less resources than required. Requested: 3, Got: 2",
			wantIs:    ErrAllocationShortfall},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			availBefore := tc.in.Available.(sets.Set[string]).Clone()
			q, ask := PreferredQueryFor(tc.in)
			if tc.wantQuery == nil {
				assert.False(t, ask, "plugin must not be asked")
				assert.Equal(t, PreferredQuery{}, q)
			} else {
				assert.True(t, ask, "plugin must be asked")
				assert.Equal(t, *tc.wantQuery, q)
			}

			got, err := Select(tc.in, tc.preferred)
			assert.Equal(t, availBefore, tc.in.Available, "input not modified")
			if tc.wantErr != "" {
				require.EqualError(t, err, tc.wantErr)
				require.ErrorIs(t, err, tc.wantIs)
				assert.Nil(t, got)
			} else {
				require.NoError(t, err)
				assert.Equal(t, tc.want, got)
			}

			// The same through a view of the set, where the tiers cover it.
			covered := sets.New(tc.in.Tiers.Aligned...).Insert(tc.in.Tiers.Unaligned...).Insert(tc.in.Tiers.NoTopology...)
			if !covered.IsSuperset(availBefore) {
				return
			}
			view := tc.in
			view.Available = opaque{availBefore}
			q2, ask2 := PreferredQueryFor(view)
			assert.Equal(t, ask, ask2, "view: plugin asked")
			assert.Equal(t, q, q2, "view: plugin query")
			got2, err2 := Select(view, tc.preferred)
			assert.Equal(t, got, got2, "view: picks")
			assert.Equal(t, fmt.Sprint(err), fmt.Sprint(err2), "view: error")
		})
	}
}

func TestSelectErrorTypes(t *testing.T) {
	_, err := Select(SelectInput{Resource: res2, Required: 2, Needed: 2, Available: sets.New("a")}, nil)
	require.ErrorIs(t, err, ErrInsufficientDevices)
	assert.EqualError(t, err, "requested number of devices unavailable for "+res2+". Requested: 2, Available: 1")
	assert.NotErrorIs(t, err, ErrAllocationShortfall)

	_, err = Select(SelectInput{Resource: res2, Required: 1, Needed: 1, Available: sets.New("a")}, nil)
	require.ErrorIs(t, err, ErrAllocationShortfall)
	assert.EqualError(t, err, "unexpectedly allocated less resources than required. Requested: 1, Got: 0")
	assert.NotErrorIs(t, err, ErrInsufficientDevices)
}

// allocate mimics devicesToAllocate's selection on one resource: available =
// all devices minus allocated, tiers from the hint, the plugin consulted when
// Select needs it.
func allocate(t *testing.T, devs DeviceInstances, allocated, reusable []string, hint []int64, request int,
	plugin func(PreferredQuery) []string) ([]string, *PreferredQuery) {
	t.Helper()
	avail := sets.KeySet(devs).Delete(allocated...)
	in := SelectInput{
		Resource: "resource", Required: request, Needed: request,
		Reusable: reusable, Available: avail, Tiers: tiersFor(devs, avail, hint),
	}
	var preferred []string
	q, ask := PreferredQueryFor(in)
	var asked *PreferredQuery
	if ask {
		asked = &q
		if plugin != nil {
			preferred = plugin(q)
		}
	}
	got, err := Select(in, preferred)
	require.NoError(t, err)
	return got, asked
}

func numaDevices(perNode map[int64][]int) DeviceInstances {
	devs := DeviceInstances{}
	for node, idx := range perNode {
		for _, i := range idx {
			id := fmt.Sprintf("Dev%d", i)
			devs[id] = numaDev(id, node)
		}
	}
	return devs
}

func span(from, to int) []int {
	var out []int
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

// Upstream TestTopologyAlignedAllocation, in our words.
func TestTopologyAlignedAllocation(t *testing.T) {
	fixed := func(ids ...string) func(PreferredQuery) []string {
		return func(PreferredQuery) []string { return ids }
	}
	cases := []struct {
		name          string
		devs          DeviceInstances
		hint          []int64
		request       int
		plugin        func(PreferredQuery) []string
		wantPreferred []string
		wantAlignment map[int64]int
	}{
		{name: "no topology: any device",
			devs: DeviceInstances{"Dev1": numaDev("Dev1"), "Dev2": numaDev("Dev2")}, hint: []int64{0, 1}, request: 1,
			wantAlignment: map[int64]int{NoTopology: 1}},
		{name: "partial alignment: the aligned device",
			devs: DeviceInstances{"Dev1": numaDev("Dev1"), "Dev2": numaDev("Dev2", 1)}, hint: []int64{1}, request: 1,
			wantAlignment: map[int64]int{1: 1}},
		{name: "single request, node 0", devs: numaDevices(map[int64][]int{0: {1}, 1: {2}}),
			hint: []int64{0}, request: 1, wantAlignment: map[int64]int{0: 1}},
		{name: "single request, node 1", devs: numaDevices(map[int64][]int{0: {1}, 1: {2}}),
			hint: []int64{1}, request: 1, wantAlignment: map[int64]int{1: 1}},
		{name: "request 2, node 0", devs: numaDevices(map[int64][]int{0: {1, 3}, 1: {2, 4}}),
			hint: []int64{0}, request: 2, wantAlignment: map[int64]int{0: 2}},
		{name: "request 2, node 1", devs: numaDevices(map[int64][]int{0: {1, 3}, 1: {2, 4}}),
			hint: []int64{1}, request: 2, wantAlignment: map[int64]int{1: 2}},
		{name: "request 4 unsatisfiable on node 0: 3 there, 1 elsewhere",
			devs: numaDevices(map[int64][]int{0: {1, 3, 5}, 1: {2, 4, 6}}),
			hint: []int64{0}, request: 4, wantAlignment: map[int64]int{0: 3, 1: 1}},
		{name: "request 4 unsatisfiable on node 1",
			devs: numaDevices(map[int64][]int{0: {1, 3, 5}, 1: {2, 4, 6}}),
			hint: []int64{1}, request: 4, wantAlignment: map[int64]int{0: 1, 1: 3}},
		{name: "request 4 over nodes 1 and 3",
			devs: numaDevices(map[int64][]int{0: {1, 5}, 1: {2, 6}, 2: {3, 7}, 3: {4, 8}}),
			hint: []int64{1, 3}, request: 4, wantAlignment: map[int64]int{1: 2, 3: 2}},
		{name: "preferred aligned devices accepted",
			devs: numaDevices(map[int64][]int{0: span(0, 100), 1: span(100, 200)}),
			hint: []int64{0}, request: 5, plugin: fixed("Dev0", "Dev19", "Dev83", "Dev42", "Dev77"),
			wantPreferred: []string{"Dev0", "Dev19", "Dev42", "Dev77", "Dev83"}, wantAlignment: map[int64]int{0: 5}},
		{name: "preferred aligned accepted, unaligned ignored",
			devs: numaDevices(map[int64][]int{0: span(0, 100), 1: span(100, 200)}),
			hint: []int64{0}, request: 5, plugin: fixed("Dev0", "Dev19", "Dev83", "Dev150", "Dev186"),
			wantPreferred: []string{"Dev0", "Dev19", "Dev83"}, wantAlignment: map[int64]int{0: 5}},
		{name: "preferred aligned accepted, bogus ignored",
			devs: numaDevices(map[int64][]int{1: span(0, 100)}),
			hint: []int64{1}, request: 5, plugin: fixed("Dev0", "Dev19", "Dev83", "bogus0", "bogus1"),
			wantPreferred: []string{"Dev0", "Dev19", "Dev83"}, wantAlignment: map[int64]int{1: 5}},
		{name: "too few aligned: all aligned, then the preferred unaligned",
			devs: numaDevices(map[int64][]int{0: span(0, 3), 1: span(3, 100)}),
			hint: []int64{0}, request: 5, plugin: fixed("Dev0", "Dev1", "Dev2", "Dev42", "Dev83"),
			wantPreferred: []string{"Dev0", "Dev1", "Dev2", "Dev42", "Dev83"}, wantAlignment: map[int64]int{0: 3, 1: 2}},
		{name: "too few aligned: preferred unaligned accepted, bogus ignored",
			devs: numaDevices(map[int64][]int{0: span(0, 3), 1: span(3, 100)}),
			hint: []int64{0}, request: 5, plugin: fixed("Dev0", "Dev1", "Dev2", "Dev42", "bogus0"),
			wantPreferred: []string{"Dev0", "Dev1", "Dev2", "Dev42"}, wantAlignment: map[int64]int{0: 3, 1: 2}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, _ := allocate(t, tc.devs, nil, nil, tc.hint, tc.request, tc.plugin)
			require.Len(t, got, tc.request)
			assert.Subset(t, got, tc.wantPreferred)
			alignment := map[int64]int{}
			for _, id := range got {
				nodes := nodesOf(tc.devs[id])
				if len(nodes) == 0 {
					alignment[NoTopology]++
					continue
				}
				alignment[nodes[0]]++
			}
			assert.Equal(t, tc.wantAlignment, alignment)

			again, _ := allocate(t, tc.devs, nil, nil, tc.hint, tc.request, tc.plugin)
			assert.Equal(t, got, again, "deterministic")
		})
	}
}

// Upstream TestGetPreferredAllocationParameters, in our words; MustInclude is
// checked too (upstream lists it but, by a slip, never compares it).
func TestGetPreferredAllocationParameters(t *testing.T) {
	ids := func(idx ...int) []string {
		out := make([]string, 0, len(idx))
		for _, i := range idx {
			out = append(out, fmt.Sprintf("Dev%d", i))
		}
		return out
	}
	cases := []struct {
		name      string
		devs      DeviceInstances
		allocated []string
		reusable  []string
		request   int
		want      PreferredQuery
	}{
		{name: "request 1, nothing allocated",
			devs: numaDevices(map[int64][]int{0: span(0, 4)}), request: 1,
			want: PreferredQuery{Available: ids(0, 1, 2, 3), MustInclude: []string{}, Size: 1}},
		{name: "request 4, 2 allocated and reusable",
			devs:      numaDevices(map[int64][]int{0: span(0, 8)}),
			allocated: ids(0, 5), reusable: ids(0, 5), request: 4,
			want: PreferredQuery{Available: ids(0, 1, 2, 3, 4, 5, 6, 7), MustInclude: ids(0, 5), Size: 4}},
		{name: "request 4, 4 allocated of which 2 reusable",
			devs:      numaDevices(map[int64][]int{0: span(0, 8)}),
			allocated: ids(0, 5, 4, 1), reusable: ids(0, 5), request: 4,
			want: PreferredQuery{Available: ids(0, 2, 3, 5, 6, 7), MustInclude: ids(0, 5), Size: 4}},
		{name: "request 6 over two nodes, 2 allocated and reusable",
			devs:      numaDevices(map[int64][]int{0: span(0, 4), 1: span(4, 8)}),
			allocated: ids(1, 6), reusable: ids(1, 6), request: 6,
			want: PreferredQuery{Available: ids(0, 1, 2, 3, 4, 5, 6, 7), MustInclude: ids(0, 1, 2, 3, 6), Size: 6}},
		{name: "request 6 over two nodes, 4 allocated of which 2 reusable",
			devs:      numaDevices(map[int64][]int{0: span(0, 4), 1: span(4, 8)}),
			allocated: ids(0, 1, 6, 7), reusable: ids(1, 6), request: 6,
			want: PreferredQuery{Available: ids(1, 2, 3, 4, 5, 6), MustInclude: ids(1, 2, 3, 6), Size: 6}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var calls int
			_, asked := allocate(t, tc.devs, tc.allocated, tc.reusable, []int64{0}, tc.request,
				func(PreferredQuery) []string { calls++; return nil })
			require.NotNil(t, asked)
			assert.Equal(t, 1, calls)
			assert.Equal(t, tc.want, *asked)
		})
	}
}

// opaque is a DeviceSet that is not a sets.Set, as a caller's view of its free
// devices is: the selection can only ask it Len and Has.
type opaque struct{ set sets.Set[string] }

func (o opaque) Len() int           { return o.set.Len() }
func (o opaque) Has(id string) bool { return o.set.Has(id) }

// A view of the free devices, with tiers that also list devices that are not
// free (every healthy device in ID order, as devmgr passes without an
// affinity), selects what the set itself with tiers of free devices only
// selects, and asks the plugin the same question; both as Select's
// documentation says.
func TestSelectFromAView(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	pick := func(from []string, p float64) []string {
		var out []string
		for _, id := range from {
			if rng.Float64() < p {
				out = append(out, id)
			}
		}
		rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
		return out
	}
	asked := 0
	for run := range 3000 {
		n := 1 + rng.IntN(12)
		all := make([]string, n)
		for i := range all {
			all[i] = fmt.Sprintf("d%02d", i)
		}
		free := sets.New(pick(all, 0.6)...)
		var exact, padded topology.Tiers
		for _, id := range all {
			if !free.Has(id) {
				continue
			}
			addTier(&exact, rng.IntN(3), id)
		}
		if run%5 == 1 {
			// topology.Tiers in preference order, not ID order (devices of a
			// second NUMA node of the affinity come after the first's).
			rng.Shuffle(len(exact.Aligned), func(i, j int) { exact.Aligned[i], exact.Aligned[j] = exact.Aligned[j], exact.Aligned[i] })
		}
		// Devices that are not free, inserted anywhere; the free ones keep
		// their order.
		pad := func(tier []string) []string {
			out := slices.Clone(tier)
			for _, id := range pick(append(slices.Clone(all), "ghost"), 0.3) {
				if !free.Has(id) {
					i := rng.IntN(len(out) + 1)
					out = slices.Insert(out, i, id)
				}
			}
			return out
		}
		padded = topology.Tiers{Aligned: pad(exact.Aligned), Unaligned: pad(exact.Unaligned), NoTopology: pad(exact.NoTopology)}
		if run%3 == 0 {
			// devmgr without an affinity: one tier, every device in ID order.
			exact = topology.Tiers{NoTopology: sets.List(free)}
			padded = topology.Tiers{NoTopology: all}
		}
		required := rng.IntN(n + 2)
		needed := max(0, required-rng.IntN(2))
		reusable := pick(append(slices.Clone(all), "r1", "r2"), 0.15)
		preferred := pick(append(slices.Clone(all), "bogus"), 0.5)

		set := SelectInput{Resource: res1, Required: required, Needed: needed, Reusable: reusable, Available: free, Tiers: exact}
		view := set
		view.Available, view.Tiers = opaque{free}, padded

		got0, q0, err0 := selectByRules(set, preferred)
		q1, ask1 := PreferredQueryFor(set)
		q2, ask2 := PreferredQueryFor(view)
		require.Equal(t, q0 != nil, ask1, "run %d: plugin asked, set", run)
		require.Equal(t, q0 != nil, ask2, "run %d: plugin asked, view", run)
		if q0 != nil {
			require.Equal(t, *q0, q1, "run %d: plugin query, set", run)
			require.Equal(t, *q0, q2, "run %d: plugin query, view", run)
			asked++
		}
		got1, err1 := Select(set, preferred)
		got2, err2 := Select(view, preferred)
		require.Equal(t, got0, got1, "run %d: picks, set", run)
		require.Equal(t, got0, got2, "run %d: picks, view", run)
		require.Equal(t, fmt.Sprint(err0), fmt.Sprint(err1), "run %d: error, set", run)
		require.Equal(t, fmt.Sprint(err0), fmt.Sprint(err2), "run %d: error, view", run)
	}
	require.Greater(t, asked, 300, "runs that asked the plugin")
}

// selectByRules is Select's documentation taken literally, for a set: the
// picks, the error, and the plugin's query if it would be asked (nil if not).
func selectByRules(in SelectInput, preferred []string) (picks []string, query *PreferredQuery, err error) {
	free := in.Available.(sets.Set[string]).Clone()
	picked := sets.New[string]()
	left := in.Needed
	// add picks, in order, the IDs of ids that ok accepts, once each,
	// until nothing is left to pick.
	add := func(ids []string, ok func(string) bool) {
		for _, id := range ids {
			if left > 0 && !picked.Has(id) && (ok == nil || ok(id)) {
				picks, left = append(picks, id), left-1
				picked.Insert(id)
			}
		}
	}
	add(in.Reusable, nil)
	free = free.Difference(picked)
	if left > 0 && free.Len() < left {
		return nil, nil, admissionErrorf(ErrInsufficientDevices,
			"requested number of devices unavailable for %s. Requested: %d, Available: %d", in.Resource, left, free.Len())
	}
	var aligned []string
	for _, id := range in.Tiers.Aligned {
		if free.Has(id) && !slices.Contains(aligned, id) {
			aligned = append(aligned, id)
		}
	}
	ask := func(cands sets.Set[string]) {
		query = &PreferredQuery{Available: sets.List(cands.Union(picked)), MustInclude: sets.List(picked), Size: in.Required}
	}
	switch {
	case left == 0:
	case left < len(aligned):
		ask(sets.New(aligned...))
		add(preferred, sets.New(aligned...).Has)
		add(aligned, nil)
	default:
		add(aligned, nil)
		if left > 0 {
			ask(free)
		}
		add(preferred, free.Has)
		add(in.Tiers.Unaligned, free.Has)
		add(in.Tiers.NoTopology, free.Has)
	}
	if left > 0 {
		return nil, query, admissionErrorf(ErrAllocationShortfall,
			"unexpectedly allocated less resources than required. Requested: %d, Got: %d", in.Required, in.Required-left)
	}
	slices.Sort(picks)
	return picks, query, nil
}

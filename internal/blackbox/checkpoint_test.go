package blackbox_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/checkpoint"
	"github.com/openkubelet/devmgr/devicemanager"
)

const fixtures = "../../testdata/kubelet-checkpoints"

// sampleBytes is the kubelet's file for one record (pod-uid-1/ctr, two
// devices on NUMA node 0, an Allocate response with env A=1) and three
// registered devices, as the kubelet wrote it (the fixture "sample").
var sampleBytes = `{"Data":{"PodDeviceEntries":[{"PodUID":"pod-uid-1","ContainerName":"ctr","ResourceName":"example.com/dev","DeviceIDs":{"0":["dev-0","dev-1"]},"AllocResp":"CgYKAUESATE="}],"RegisteredDevices":{"example.com/dev":["dev-0","dev-1","dev-2"]}},"Checksum":648430460}`

func sampleEntry() checkpoint.PodDevicesEntry {
	return checkpoint.PodDevicesEntry{
		PodUID: "pod-uid-1", ContainerName: "ctr", ResourceName: "example.com/dev",
		DeviceIDs: checkpoint.DevicesPerNUMA{0: {"dev-0", "dev-1"}},
		AllocResp: []byte{0x0a, 0x06, 0x0a, 0x01, 0x41, 0x12, 0x01, 0x31},
	}
}

func TestCheckpointMatchesKubeletSampleBytes(t *testing.T) {
	cp := checkpoint.New([]checkpoint.PodDevicesEntry{sampleEntry()}, map[string][]string{"example.com/dev": {"dev-0", "dev-1", "dev-2"}})
	b, err := cp.MarshalCheckpoint()
	require.NoError(t, err)
	assert.Equal(t, sampleBytes, string(b))
	sum := sha256.Sum256(b)
	assert.Equal(t, "58d17cafba4c0a3a446935a6017c1358772c2e3524a18db82b25574d80dfe8da", hex.EncodeToString(sum[:]))
	require.NoError(t, cp.VerifyChecksum())

	var resp pluginapi.ContainerAllocateResponse
	require.NoError(t, proto.Unmarshal(sampleEntry().AllocResp, &resp))
	assert.Equal(t, map[string]string{"A": "1"}, resp.Envs)
}

// Checksums the kubelet computes for small documents; a nil list and an
// empty one hash differently.
func TestCheckpointReferenceChecksums(t *testing.T) {
	cases := []struct {
		name    string
		entries []checkpoint.PodDevicesEntry
		reg     map[string][]string
		want    uint64
	}{
		{"null entries, empty registered", nil, map[string][]string{}, 3467439661},
		{"empty entries", []checkpoint.PodDevicesEntry{}, map[string][]string{}, 2932075448},
		{"empty id list", nil, map[string][]string{"example.com/dev": {}}, 4190085820},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, err := checkpoint.New(tc.entries, tc.reg).MarshalCheckpoint()
			require.NoError(t, err)
			var out struct{ Checksum uint64 }
			require.NoError(t, json.Unmarshal(b, &out))
			assert.Equal(t, tc.want, out.Checksum)
		})
	}
	b, err := checkpoint.New(nil, map[string][]string{}).MarshalCheckpoint()
	require.NoError(t, err)
	assert.Equal(t, string(readFile(t, filepath.Join(fixtures, "empty", checkpoint.DeviceManagerKey))), string(b))
}

// copyFixture copies one fixture into a fresh directory.
func copyFixture(t *testing.T, name string) string {
	t.Helper()
	dir := tempDir(t)
	b := readFile(t, filepath.Join(fixtures, name, checkpoint.DeviceManagerKey))
	require.NoError(t, os.WriteFile(filepath.Join(dir, checkpoint.DeviceManagerKey), b, 0o600))
	return dir
}

// Kubelet-written fixtures decode and re-encode byte for byte.
func TestKubeletFixturesRoundTrip(t *testing.T) {
	for _, tc := range []struct{ name, want string }{
		{"sample", "sample"}, {"empty", "empty"}, {"reformatted", "sample"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := copyFixture(t, tc.name)
			cm, err := checkpoint.NewManager(dir)
			require.NoError(t, err)
			cp := checkpoint.New(nil, nil)
			require.NoError(t, cm.GetCheckpoint(checkpoint.DeviceManagerKey, cp))
			require.NoError(t, cp.VerifyChecksum())
			want := readFile(t, filepath.Join(fixtures, tc.want, checkpoint.DeviceManagerKey))

			entries, reg := cp.GetData()
			b, err := checkpoint.New(entries, reg).MarshalCheckpoint()
			require.NoError(t, err)
			assert.Equal(t, string(want), string(b))
			b, err = cp.MarshalCheckpoint()
			require.NoError(t, err)
			assert.Equal(t, string(want), string(b))

			out := tempDir(t)
			cm2, err := checkpoint.NewManager(out)
			require.NoError(t, err)
			require.NoError(t, cm2.CreateCheckpoint(checkpoint.DeviceManagerKey, checkpoint.New(entries, reg)))
			assert.Equal(t, string(want), string(readFile(t, filepath.Join(out, checkpoint.DeviceManagerKey))))
			st, err := os.Stat(filepath.Join(out, checkpoint.DeviceManagerKey))
			require.NoError(t, err)
			assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
			names, err := cm2.ListCheckpoints()
			require.NoError(t, err)
			assert.Equal(t, []string{checkpoint.DeviceManagerKey}, names)
			des, err := os.ReadDir(out)
			require.NoError(t, err)
			assert.Len(t, des, 1, "temp files left behind")

			if tc.want == "sample" {
				assert.Equal(t, []checkpoint.PodDevicesEntry{sampleEntry()}, entries)
				assert.Equal(t, map[string][]string{"example.com/dev": {"dev-0", "dev-1", "dev-2"}}, reg)
			} else {
				assert.Empty(t, entries)
				assert.Equal(t, map[string][]string{}, reg)
			}
		})
	}
}

func TestCheckpointErrors(t *testing.T) {
	t.Run("corrupt", func(t *testing.T) {
		cm, err := checkpoint.NewManager(copyFixture(t, "corrupt"))
		require.NoError(t, err)
		err = cm.GetCheckpoint(checkpoint.DeviceManagerKey, checkpoint.New(nil, nil))
		require.Error(t, err)
		assert.ErrorIs(t, err, &checkpoint.CorruptError{})
		assert.ErrorIs(t, err, &checkpoint.CorruptError{ActualCS: 1, ExpectedCS: 2}, "Is matches any CorruptError")
		var ce *checkpoint.CorruptError
		require.ErrorAs(t, err, &ce)
		assert.Equal(t, uint64(648430460), ce.ActualCS)
		assert.Equal(t, uint64(648430461), ce.ExpectedCS)
		assert.Contains(t, err.Error(), "checkpoint is corrupted")
		assert.NotErrorIs(t, err, checkpoint.ErrNotFound)
	})
	t.Run("badjson", func(t *testing.T) {
		cm, err := checkpoint.NewManager(copyFixture(t, "badjson"))
		require.NoError(t, err)
		err = cm.GetCheckpoint(checkpoint.DeviceManagerKey, checkpoint.New(nil, nil))
		require.Error(t, err)
		assert.Contains(t, err.Error(), "unexpected end of JSON input")
		assert.NotErrorIs(t, err, &checkpoint.CorruptError{})
		assert.NotErrorIs(t, err, checkpoint.ErrNotFound)
	})
	t.Run("legacy-v1", func(t *testing.T) {
		cm, err := checkpoint.NewManager(copyFixture(t, "legacy-v1"))
		require.NoError(t, err)
		err = cm.GetCheckpoint(checkpoint.DeviceManagerKey, checkpoint.New(nil, nil))
		require.Error(t, err)
		assert.NotErrorIs(t, err, checkpoint.ErrNotFound)
	})
	t.Run("not found", func(t *testing.T) {
		cm, err := checkpoint.NewManager(tempDir(t))
		require.NoError(t, err)
		err = cm.GetCheckpoint(checkpoint.DeviceManagerKey, checkpoint.New(nil, nil))
		require.Error(t, err)
		assert.ErrorIs(t, err, checkpoint.ErrNotFound)
		assert.Equal(t, "checkpoint is not found", checkpoint.ErrNotFound.Error())
		assert.NoError(t, cm.RemoveCheckpoint(checkpoint.DeviceManagerKey), "removing a missing key")
	})
	t.Run("tampered data", func(t *testing.T) {
		var cp checkpoint.Checkpoint = checkpoint.New(nil, nil)
		require.NoError(t, cp.UnmarshalCheckpoint([]byte(sampleBytes)))
		require.NoError(t, cp.VerifyChecksum())
		tampered := []byte(strings.Replace(sampleBytes, "dev-2", "dev-3", 1))
		require.NoError(t, cp.UnmarshalCheckpoint(tampered))
		assert.ErrorIs(t, cp.VerifyChecksum(), &checkpoint.CorruptError{})
	})
}

// The store's key rules (the kubelet's), listing (dot files are temporary
// and not listed) and removal (of a missing key too).
func TestCheckpointStoreKeys(t *testing.T) {
	dir := tempDir(t)
	cm, err := checkpoint.NewManager(dir)
	require.NoError(t, err)
	cp := checkpoint.New(nil, map[string][]string{})
	for _, bad := range []string{"/id1", ".id1", "   ", "___", "a7.87-677-", "a/b"} {
		assert.Error(t, cm.CreateCheckpoint(bad, cp), "key %q accepted", bad)
	}
	for _, good := range []string{"id1", "id2", "a7.87-6_8"} {
		require.NoError(t, cm.CreateCheckpoint(good, cp), good)
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, ".tmp123"), nil, 0o600))
	names, err := cm.ListCheckpoints()
	require.NoError(t, err)
	sort.Strings(names)
	assert.Equal(t, []string{"a7.87-6_8", "id1", "id2"}, names)
	require.NoError(t, cm.RemoveCheckpoint("id1"))
	require.NoError(t, cm.RemoveCheckpoint("id1"))
	assert.ErrorIs(t, cm.GetCheckpoint("id1", checkpoint.New(nil, nil)), checkpoint.ErrNotFound)
}

// What the manager writes after admissions: entries in admission order, IDs
// sorted, RegisteredDevices the healthy IDs, the plugin's answers in
// deterministic protobuf, each device under its NUMA nodes (-1 without
// topology). The kubelet writes map order, so the same state can give
// different files; devmgr always writes the same bytes for the same history.
func TestCheckpointContentAfterAdmission(t *testing.T) {
	e := newEnv(t, func(o *devicemanager.Options) { o.NUMANodes = []int{0, 1} })
	e.start(t)
	gpu := e.plugin(t, "g.sock", resGPU, nil,
		healthy("g1", 1), healthy("g0", 0), healthy("g3", 0, 1), healthy("g2"), unhealthy("g4", 0))
	e.plugin(t, "n.sock", resNIC, nil, healthy("n1"), healthy("n0"))
	manyEnvs := &pluginapi.ContainerAllocateResponse{
		Envs:        map[string]string{"Z": "1", "A": "2", "M": "3", "B": "4", "Y": "5"},
		Annotations: map[string]string{"k2": "v", "k1": "v", "k3": "v"},
	}
	gpu.setAllocate(fixedResponse(manyEnvs))

	u3 := pod("u3", ctr("b", resGPU, 1))
	u1 := pod("u1", ctr("z", resGPU, 1, resNIC, 1), ctr("a", resNIC, 1))
	u2 := pod("u2", ctr("c", resGPU, 2))
	type admission struct {
		p *v1.Pod
		c string
	}
	admit := []admission{{u3, "b"}, {u1, "z"}, {u2, "c"}, {u1, "a"}}
	for _, a := range admit {
		require.NoError(t, e.allocate(a.p, a.c))
	}

	ckPath := filepath.Join(e.dir, checkpoint.DeviceManagerKey)
	st, err := os.Stat(ckPath)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())

	entries, reg := readCheckpoint(t, e.dir)
	var order [][3]string
	for _, en := range entries {
		order = append(order, [3]string{en.PodUID, en.ContainerName, en.ResourceName})
	}
	assert.Equal(t, [][3]string{
		{"u3", "b", resGPU}, {"u1", "z", resGPU}, {"u1", "z", resNIC}, {"u2", "c", resGPU}, {"u1", "a", resNIC},
	}, order, "entries not in admission order (a container's resources in name order)")

	assert.Equal(t, map[string][]string{resGPU: {"g0", "g1", "g2", "g3"}, resNIC: {"n0", "n1"}}, reg,
		"RegisteredDevices must be the sorted healthy IDs")

	wantResp, err := proto.MarshalOptions{Deterministic: true}.Marshal(manyEnvs)
	require.NoError(t, err)
	for _, en := range entries {
		for numa, list := range en.DeviceIDs {
			assert.True(t, slices.IsSorted(list), "IDs under NUMA %d not sorted: %v", numa, list)
		}
		// NUMA keys match the devices' topology.
		held := e.mgr.GetDevices(en.PodUID, en.ContainerName)[en.ResourceName]
		all := sets.New[string]()
		for numa, list := range en.DeviceIDs {
			for _, id := range list {
				all.Insert(id)
				want := deviceNUMA(id)
				if numa == -1 {
					assert.Empty(t, want, "%s under -1", id)
				} else {
					assert.Contains(t, want, numa, "%s under %d", id, numa)
				}
			}
		}
		assert.Equal(t, sets.KeySet(held), all)
		if en.ResourceName == resGPU {
			assert.Equal(t, wantResp, en.AllocResp, "AllocResp not deterministic protobuf")
			for id := range all {
				assert.Len(t, idsUnder(en.DeviceIDs, id), len(deviceNUMA(id))+boolInt(len(deviceNUMA(id)) == 0), "%s keys", id)
			}
		} else {
			var r pluginapi.ContainerAllocateResponse
			require.NoError(t, proto.Unmarshal(en.AllocResp, &r))
			assert.Len(t, r.Envs, 1)
		}
	}

	// The same ledger writes the same bytes.
	b, err := checkpoint.New(entries, reg).MarshalCheckpoint()
	require.NoError(t, err)
	assert.Equal(t, string(readFile(t, ckPath)), string(b))
}

func deviceNUMA(id string) []int64 {
	switch id {
	case "g0":
		return []int64{0}
	case "g1":
		return []int64{1}
	case "g3":
		return []int64{0, 1}
	}
	return nil
}

func idsUnder(m checkpoint.DevicesPerNUMA, id string) []int64 {
	var out []int64
	for k, list := range m {
		if slices.Contains(list, id) {
			out = append(out, k)
		}
	}
	return out
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Manager start on each kubelet fixture.
func TestManagerStartsOnKubeletFixtures(t *testing.T) {
	for _, tc := range []struct {
		name     string
		restored bool
		numa     int64
	}{
		{"sample", true, 0},
		{"reformatted", true, 0},
		{"legacy-v1-valid", true, -1},
		{"empty", false, 0},
		// Bad files: the kubelet starts empty and overwrites them on its
		// next write; devmgr moves them aside for inspection, as
		// kubelet_internal_checkpoint.bad-<unix time>.
		{"corrupt", false, 0},
		{"badjson", false, 0},
		{"legacy-v1", false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := copyFixture(t, tc.name)
			orig := readFile(t, filepath.Join(dir, checkpoint.DeviceManagerKey))
			m, err := devicemanager.NewManagerImpl(devicemanager.Options{SocketDir: dir})
			require.NoError(t, err)
			require.NoError(t, m.Start(nil, nil, nil, nil), "a bad checkpoint must not fail Start")
			defer func() { _ = m.Stop() }()
			got := m.GetDevices("pod-uid-1", "ctr")
			if !tc.restored {
				assert.Empty(t, got)
				if tc.name == "empty" {
					assert.Equal(t, string(orig), string(readFile(t, filepath.Join(dir, checkpoint.DeviceManagerKey))), "file changed by Start")
					return
				}
				_, err := os.Stat(filepath.Join(dir, checkpoint.DeviceManagerKey))
				assert.ErrorIs(t, err, os.ErrNotExist, "a bad checkpoint is moved aside")
				aside, err := filepath.Glob(filepath.Join(dir, checkpoint.DeviceManagerKey+".bad-*"))
				require.NoError(t, err)
				require.Len(t, aside, 1)
				assert.Equal(t, string(orig), string(readFile(t, aside[0])))
				return
			}
			devs := got["example.com/dev"]
			assert.Equal(t, []string{"dev-0", "dev-1"}, keys(devs))
			for id, d := range devs {
				if tc.numa < 0 {
					assert.Nil(t, d.GetTopology(), id)
				} else {
					require.NotNil(t, d.GetTopology(), id)
					require.Len(t, d.Topology.Nodes, 1)
					assert.Equal(t, tc.numa, d.Topology.Nodes[0].ID)
				}
			}
			p := pod("pod-uid-1", ctr("ctr", "example.com/dev", 2))
			o, err := m.GetDeviceRunContainerOptions(context.Background(), p, &p.Spec.Containers[0])
			require.NoError(t, err)
			require.NotNil(t, o)
			assert.Equal(t, []devicemanager.EnvVar{{Name: "A", Value: "1"}}, o.Envs)
		})
	}
}

// MarshalCheckpoint encodes exactly the data given, in the order given (nil
// stays null), and the document reads back to the same entries.
func TestCheckpointEncodesDataAsGiven(t *testing.T) {
	b, err := checkpoint.New(nil, nil).MarshalCheckpoint()
	require.NoError(t, err)
	assert.Contains(t, string(b), `{"Data":{"PodDeviceEntries":null,"RegisteredDevices":null},"Checksum":`)
	e1 := checkpoint.PodDevicesEntry{PodUID: "b", ContainerName: "c", ResourceName: "r", DeviceIDs: checkpoint.DevicesPerNUMA{1: {"y", "x"}}}
	e2 := checkpoint.PodDevicesEntry{PodUID: "a", ContainerName: "c", ResourceName: "r", DeviceIDs: checkpoint.DevicesPerNUMA{10: {"z"}, 2: {"w"}, -1: {"v"}}}
	b, err = checkpoint.New([]checkpoint.PodDevicesEntry{e1, e2}, map[string][]string{"r": {"y", "x"}}).MarshalCheckpoint()
	require.NoError(t, err)
	assert.Contains(t, string(b), `{"PodUID":"b","ContainerName":"c","ResourceName":"r","DeviceIDs":{"1":["y","x"]},"AllocResp":null},{"PodUID":"a","ContainerName":"c","ResourceName":"r","DeviceIDs":{"-1":["v"],"10":["z"],"2":["w"]},"AllocResp":null}`)
	assert.Contains(t, string(b), `"RegisteredDevices":{"r":["y","x"]}`)
	cp := checkpoint.New(nil, nil)
	require.NoError(t, cp.UnmarshalCheckpoint(b))
	require.NoError(t, cp.VerifyChecksum())
	entries, _ := cp.GetData()
	assert.Equal(t, []checkpoint.PodDevicesEntry{e1, e2}, entries)
}

// The checkpoint keeps a registered resource with no healthy device as an
// empty list, as the kubelet does, including one restored from a
// checkpoint whose plugin is not back.
func TestCheckpointKeepsUnhealthyResourceAsEmptyList(t *testing.T) {
	e := newEnv(t, nil)
	e.start(t)
	pl := e.plugin(t, "p.sock", resGPU, nil, healthy("d0"))
	require.NoError(t, e.allocate(pod("u1", ctr("c", resGPU, 1)), "c"))
	pl.update(unhealthy("d0"))
	e.waitCapacity(t, resGPU, 1, 0)
	require.Eventually(t, func() bool {
		_, reg, ok := tryReadCheckpoint(e.dir)
		l, has := reg[resGPU]
		return ok && has && l != nil && len(l) == 0
	}, waitFor, tick, "all-unhealthy resource must be written as []")
	pl.stop()
	// The capacity is 1/0 already: the stopped endpoint shows the plugin gone.
	require.Eventually(t, func() bool {
		for _, r := range e.mgr.Status() {
			if r.Name == resGPU {
				return len(r.Endpoints) == 1 && r.Endpoints[0].Stopped
			}
		}
		return false
	}, waitFor, tick, "the manager sees the plugin gone")
	e.waitCapacity(t, resGPU, 1, 0)
	require.NoError(t, e.mgr.Stop())

	e.start(t)
	e.plugin(t, "n.sock", resNIC, nil, healthy("n0"))
	require.Eventually(t, func() bool {
		_, reg, ok := tryReadCheckpoint(e.dir)
		return ok && len(reg[resNIC]) == 1
	}, waitFor, tick)
	_, reg := readCheckpoint(t, e.dir)
	l, ok := reg[resGPU]
	assert.True(t, ok, "restored resource dropped from RegisteredDevices")
	assert.NotNil(t, l)
	assert.Empty(t, l)
}

package checkpoint

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"strings"

	legacyspew "github.com/openkubelet/devmgr/checkpoint/internal/legacyspew"
)

// spewText is the text the kubelet hashes for d: the reference that the
// hand-written checksum must match.
func spewText(d checkpointData) string { return legacyspew.ForHash.Sprintf("%#v", d) }

// spewChecksum is the kubelet's checksum computed the kubelet's way.
func spewChecksum(d checkpointData) uint64 { return fnvOfText(spewText(d)) }

// fnvOfText is the kubelet's hash of a text.
func fnvOfText(text string) uint64 {
	h := fnv.New32a()
	fmt.Fprintf(h, "%v", text)
	return uint64(h.Sum32())
}

func legacyRefEntries(d *legacyCheckpointData) []legacyspew.PodDevicesEntry {
	if d.PodDeviceEntries == nil {
		return nil
	}
	out := make([]legacyspew.PodDevicesEntry, len(d.PodDeviceEntries))
	for i, e := range d.PodDeviceEntries {
		out[i] = legacyspew.PodDevicesEntry(e)
	}
	return out
}

// legacySpewChecksum is the checksum a pre-1.20 kubelet computed for d.
func legacySpewChecksum(d *legacyCheckpointData) uint64 {
	return fnvOfText(legacyspew.Text(legacyRefEntries(d), d.RegisteredDevices))
}

// gen builds arbitrary checkpoint content from a seeded source: nil and empty
// values, negative and large NUMA keys, unicode, control characters, spaces,
// colons and brackets in strings, which go-spew prints raw.
type gen struct{ r *rand.Rand }

func newGen(seed1, seed2 uint64) gen { return gen{rand.New(rand.NewPCG(seed1, seed2))} }

var genAlphabet = []string{"a", "Z", "0", "-", ".", "/", " ", ":", "[", "]", "{", "}", "(", ")",
	"<nil>", "\x00", "\n", "\t", "é", "✓", "\"", "\\", "map[", "GPU-"}

func (g gen) str() string {
	var b strings.Builder
	for range g.r.IntN(8) {
		b.WriteString(genAlphabet[g.r.IntN(len(genAlphabet))])
	}
	return b.String()
}

func (g gen) strs() []string {
	switch g.r.IntN(5) {
	case 0:
		return nil
	case 1:
		return []string{}
	}
	out := make([]string, g.r.IntN(5)+1)
	for i := range out {
		out[i] = g.str()
	}
	return out
}

func (g gen) bytes() []byte {
	switch g.r.IntN(4) {
	case 0:
		return nil
	case 1:
		return []byte{}
	}
	b := make([]byte, g.r.IntN(12)+1)
	for i := range b {
		b[i] = byte(g.r.IntN(256))
	}
	return b
}

func (g gen) numa() DevicesPerNUMA {
	if g.r.IntN(5) == 0 {
		return nil
	}
	m := DevicesPerNUMA{}
	keys := []int64{-1, 0, 1, 2, 9, 10, 11, 63, 64, -100, 1 << 40}
	for range g.r.IntN(5) {
		m[keys[g.r.IntN(len(keys))]] = g.strs()
	}
	return m
}

func (g gen) registered() map[string][]string {
	if g.r.IntN(5) == 0 {
		return nil
	}
	m := map[string][]string{}
	for range g.r.IntN(5) {
		m[g.str()] = g.strs()
	}
	return m
}

func (g gen) data() checkpointData {
	d := checkpointData{RegisteredDevices: g.registered()}
	switch g.r.IntN(5) {
	case 0:
		return d
	case 1:
		d.PodDeviceEntries = []PodDevicesEntry{}
		return d
	}
	for range g.r.IntN(6) + 1 {
		d.PodDeviceEntries = append(d.PodDeviceEntries, PodDevicesEntry{
			PodUID: g.str(), ContainerName: g.str(), ResourceName: g.str(),
			DeviceIDs: g.numa(), AllocResp: g.bytes(),
		})
	}
	return d
}

func (g gen) legacy() legacyCheckpointData {
	d := legacyCheckpointData{RegisteredDevices: g.registered()}
	if g.r.IntN(4) == 0 {
		return d
	}
	d.PodDeviceEntries = []legacyEntry{}
	for range g.r.IntN(6) {
		d.PodDeviceEntries = append(d.PodDeviceEntries, legacyEntry{
			PodUID: g.str(), ContainerName: g.str(), ResourceName: g.str(),
			DeviceIDs: g.strs(), AllocResp: g.bytes(),
		})
	}
	return d
}

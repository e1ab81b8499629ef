package podstate

import (
	"fmt"
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/checkpoint"
)

// benchResp is a typical plugin response: a device node, a mount, two envs
// and an annotation.
func benchResp(i int) *pluginapi.ContainerAllocateResponse {
	return newResp(
		withEnvs("VISIBLE_DEVICES", fmt.Sprint(i), "DRIVER_CAPABILITIES", "compute,utility"),
		withDevices(fmt.Sprintf("/dev/accel%d", i), fmt.Sprintf("/dev/accel%d", i)),
		withMounts("/usr/lib/accel", "/opt/accel/lib"),
		withAnnotations("vendor.example.com/device", fmt.Sprint(i)),
	)
}

func benchLedger(pods int) *Ledger {
	l := NewLedger()
	for i := range pods {
		l.Insert(fmt.Sprintf("pod-%04d-uid", i), "main", res1,
			checkpoint.DevicesPerNUMA{int64(i % 2): {fmt.Sprintf("dev-%04d", i)}}, benchResp(i))
	}
	return l
}

// BenchmarkToCheckpoint: the conversion done on every admission, 1,000 pods
// holding one device each.
func BenchmarkToCheckpoint(b *testing.B) {
	l := benchLedger(1000)
	b.ReportAllocs()
	for b.Loop() {
		entries, err := l.ToCheckpoint()
		if err != nil || len(entries) != 1000 {
			b.Fatal(len(entries), err)
		}
	}
}

// BenchmarkInsert: one record, its response encoded once.
func BenchmarkInsert(b *testing.B) {
	l := NewLedger()
	numa := checkpoint.DevicesPerNUMA{0: {"dev-0"}}
	resp := benchResp(0)
	b.ReportAllocs()
	for b.Loop() {
		l.Insert("pod", "main", res1, numa, resp)
	}
}

// BenchmarkOwners: the owner lookup of a health update, with 1,000 pods.
func BenchmarkOwners(b *testing.B) {
	l := benchLedger(1000)
	b.ReportAllocs()
	for b.Loop() {
		if len(l.Owners(res1, "dev-0500")) != 1 {
			b.Fatal("owner not found")
		}
	}
}

// BenchmarkAdmission: one admission's ledger work on a node with 1,000 pods:
// reserve, commit, convert to checkpoint entries; then the pod is collected.
func BenchmarkAdmission(b *testing.B) {
	l := benchLedger(1000)
	resp := benchResp(0)
	devs := DeviceInstances{"dev-new": numaDev("dev-new", 0)}
	b.ReportAllocs()
	for b.Loop() {
		rid, err := l.Reserve("pod-0500-new", "main", res1, []string{"dev-new"})
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Commit(rid, devs, resp); err != nil {
			b.Fatal(err)
		}
		if entries, err := l.ToCheckpoint(); err != nil || len(entries) != 1001 {
			b.Fatal(len(entries), err)
		}
		l.DeletePods("pod-0500-new")
	}
}

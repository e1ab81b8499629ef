package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// kubeletFile is container_manager_linux.go of the k8s.io/kubernetes this
// module requires, from the module cache.
func kubeletFile(t *testing.T) (module, []byte) {
	t.Helper()
	mod, err := kubernetes()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(mod.Dir, target))
	if err != nil {
		t.Fatal(err)
	}
	return mod, b
}

func TestPatchReplacesTheOneConstruction(t *testing.T) {
	mod, orig := kubeletFile(t)
	got, err := patch(mod.Version, orig)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(got, []byte(oldCall)) || bytes.Count(got, []byte(newCall)) != 1 {
		t.Fatalf("the patched file holds the kubelet's construction %d times and devmgr's %d times, want 0 and 1",
			bytes.Count(got, []byte(oldCall)), bytes.Count(got, []byte(newCall)))
	}
	if len(got) != len(orig)-len(oldCall)+len(newCall) {
		t.Fatalf("the patch changed %d bytes more than the one line", len(got)-(len(orig)-len(oldCall)+len(newCall)))
	}
}

func TestPatchRefusesAnotherKubelet(t *testing.T) {
	mod, orig := kubeletFile(t)
	edited := bytes.Replace(orig, []byte("Creating device plugin manager"), []byte("Creating the device manager"), 1)
	for _, c := range []struct {
		name, version string
		file          []byte
	}{
		{"another version", "v1.38.0", orig},
		{"an edited file", mod.Version, edited},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := patch(c.version, c.file)
			if err == nil || !strings.Contains(err.Error(), "the overlay was written for k8s.io/kubernetes "+writtenFor) {
				t.Fatalf("patch = %v, want a refusal naming the version it was written for", err)
			}
		})
	}
}

func TestPruneKeepsOtherKinds(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"kubelet-v1.37.2-aaaaaaaaaaaa", "kubelet-v1.37.2-bbbbbbbbbbbb", "kubelet-v1.37.2-devmgr-cccccccccccc",
		"kubelet-v1.37.2-dddddddddddd.123"} {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	prune(dir, "kubelet-v1.37.2", filepath.Join(dir, "kubelet-v1.37.2-bbbbbbbbbbbb"), &bytes.Buffer{})
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
	}
	want := "kubelet-v1.37.2-bbbbbbbbbbbb kubelet-v1.37.2-dddddddddddd.123 kubelet-v1.37.2-devmgr-cccccccccccc"
	if strings.Join(left, " ") != want {
		t.Fatalf("left %v, want %s", left, want)
	}
}

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/openkubelet/devmgr/devicemanager"
)

func TestPodStoreRoundTrip(t *testing.T) {
	dir := t.TempDir()
	s := newPodStore(dir)
	pods, err := s.load()
	require.NoError(t, err)
	assert.Nil(t, pods, "no file: no pods")

	want := []*v1.Pod{
		{ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "ml", UID: "u-a"}, Spec: v1.PodSpec{Containers: []v1.Container{{
			Name: "c", Resources: v1.ResourceRequirements{Limits: v1.ResourceList{gpu: resource.MustParse("2")}},
		}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "b", Namespace: "default", UID: "u-b"}, Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c"}}}},
	}
	require.NoError(t, s.sync(func() []*v1.Pod { return want }))
	got, err := s.load()
	require.NoError(t, err)
	require.Len(t, got, 2)
	for i := range want {
		assert.Equal(t, want[i].UID, got[i].UID, "in order")
		assert.True(t, want[i].Spec.Containers[0].Resources.Limits.Name(gpu, resource.DecimalSI).Equal(
			*got[i].Spec.Containers[0].Resources.Limits.Name(gpu, resource.DecimalSI)))
	}

	require.NoError(t, s.sync(func() []*v1.Pod { return nil }))
	got, err = s.load()
	require.NoError(t, err)
	assert.Empty(t, got)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "no temporary file is left")
	assert.Equal(t, podsFileName, entries[0].Name())
}

func TestPodStoreRefusesBadFiles(t *testing.T) {
	for name, content := range map[string]string{
		"not JSON":      "{",
		"other version": `{"version": 2, "pods": []}`,
		"unknown field": `{"version": 1, "pods": [], "extra": true}`,
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			require.NoError(t, os.WriteFile(filepath.Join(dir, podsFileName), []byte(content), 0o600))
			_, err := newPodStore(dir).load()
			require.Error(t, err)
			assert.Contains(t, err.Error(), filepath.Join(dir, podsFileName), "the message names the file")
		})
	}
}

// The pods file must not make the checkpoint directory look used: the
// kubelet resets extended resources only when the directory is empty.
func TestPodStoreIsInvisibleToTheCheckpointStore(t *testing.T) {
	dir := shortTempDir(t)
	require.NoError(t, newPodStore(dir).sync(func() []*v1.Pod { return nil }))
	// A leftover temporary file too.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "."+strings.TrimPrefix(podsFileName, ".")+".tmp-1"), nil, 0o600))
	m, err := devicemanager.NewManagerImpl(devicemanager.Options{SocketDir: dir, Logger: logr.Discard()})
	require.NoError(t, err)
	assert.True(t, m.ShouldResetExtendedResourceCapacity())
}

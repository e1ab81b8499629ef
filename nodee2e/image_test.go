package nodee2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
)

// The node's images: no registry is reachable, so each is an OCI image
// layout written here and imported into containerd; the pods never pull
// (imagePullPolicy: Never).
const (
	busyboxImage = "docker.io/library/busybox:node-e2e"
	pauseImage   = "registry.k8s.io/pause:node-e2e"
)

// busyboxApplets are the commands the tests' containers run, each a link to
// the static busybox.
var busyboxApplets = []string{"sh", "sleep", "cat", "ls", "env", "test", "stat", "grep", "echo", "mount"}

// imageFile is one file of an image's only layer.
type imageFile struct {
	name string // path in the image, without a leading slash
	mode int64
	body []byte // nil for a directory or a link
	link string // the target of a symbolic link
}

// busyboxLayer is the static busybox at bin/busybox (Debian's
// busybox-static) with a link per applet, and the directories containers
// expect.
func busyboxLayer(busybox string) ([]imageFile, error) {
	b, err := os.ReadFile(busybox)
	if err != nil {
		return nil, fmt.Errorf("the busybox image needs a static busybox (Debian's busybox-static): %w", err)
	}
	files := []imageFile{{name: "bin", mode: 0o755}, {name: "tmp", mode: 0o1777}, {name: "etc", mode: 0o755},
		{name: "bin/busybox", mode: 0o755, body: b}}
	for _, a := range busyboxApplets {
		files = append(files, imageFile{name: "bin/" + a, mode: 0o777, link: "busybox"})
	}
	return files, nil
}

// writeImage writes an OCI image layout tar to out: one layer of files, the
// image's command, and its name in the annotations containerd's import
// reads.
func writeImage(out, name string, files []imageFile, entrypoint []string) error {
	var layer bytes.Buffer
	zw := gzip.NewWriter(&layer)
	diff := sha256.New()
	if err := writeTar(io.MultiWriter(zw, diff), files); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	config, err := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"config":       map[string]any{"Entrypoint": entrypoint, "Env": []string{"PATH=/bin"}},
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{fmt.Sprintf("sha256:%x", diff.Sum(nil))}},
	})
	if err != nil {
		return err
	}
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        descriptor("application/vnd.oci.image.config.v1+json", config, nil),
		"layers":        []any{descriptor("application/vnd.oci.image.layer.v1.tar+gzip", layer.Bytes(), nil)},
	})
	if err != nil {
		return err
	}
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"manifests": []any{descriptor("application/vnd.oci.image.manifest.v1+json", manifest, map[string]string{
			"io.containerd.image.name":          name,
			"org.opencontainers.image.ref.name": name[strings.LastIndex(name, ":")+1:],
		})},
	})
	if err != nil {
		return err
	}
	layout := []imageFile{
		{name: "oci-layout", mode: 0o644, body: []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{name: "index.json", mode: 0o644, body: index},
		{name: "blobs", mode: 0o755},
		{name: "blobs/sha256", mode: 0o755},
	}
	for _, blob := range [][]byte{config, manifest, layer.Bytes()} {
		layout = append(layout, imageFile{name: fmt.Sprintf("blobs/sha256/%x", sha256.Sum256(blob)), mode: 0o644, body: blob})
	}
	var archive bytes.Buffer
	if err := writeTar(&archive, layout); err != nil {
		return err
	}
	return os.WriteFile(out, archive.Bytes(), 0o644)
}

func descriptor(mediaType string, blob []byte, annotations map[string]string) map[string]any {
	d := map[string]any{"mediaType": mediaType, "digest": fmt.Sprintf("sha256:%x", sha256.Sum256(blob)), "size": len(blob)}
	if annotations != nil {
		d["annotations"] = annotations
	}
	return d
}

func writeTar(w io.Writer, files []imageFile) error {
	tw := tar.NewWriter(w)
	for _, f := range files {
		h := &tar.Header{Name: f.name, Mode: f.mode, Uid: 0, Gid: 0, Format: tar.FormatPAX}
		switch {
		case f.link != "":
			h.Typeflag, h.Linkname = tar.TypeSymlink, f.link
		case f.body == nil:
			h.Typeflag, h.Name = tar.TypeDir, f.name+"/"
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if f.body != nil {
			if _, err := tw.Write(f.body); err != nil {
				return err
			}
		}
	}
	return tw.Close()
}

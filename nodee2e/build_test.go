package nodee2e

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/openkubelet/devmgr/e2e/cluster"
)

const (
	samplePluginPkg  = "k8s.io/kubernetes/test/images/sample-device-plugin"
	containerdModule = "github.com/containerd/containerd/v2"
	stockKubelet     = "stock"
	devmgrKubelet    = "devmgr"
	staticBusybox    = "/bin/busybox"
)

// binaries are the node's executables and images.
type binaries struct {
	cluster.Binaries
	// Kubelets by kind: the stock kubelet and make kubelet's, both from
	// the kubelet/ module.
	Kubelets map[string]string
	// ContainerdDir holds containerd, containerd-shim-runc-v2 and ctr.
	ContainerdDir string
	SamplePlugin  string
	// Devmgr is the devmgr command of this tree, built for the run.
	Devmgr string
	// Images are OCI image layouts to import into containerd.
	Images []string
}

// build builds what is missing into the e2e cache (the control plane, the
// sample device plugin, containerd, both kubelets, under names that carry
// their versions) and the run's devmgr, pause binary and images into dir,
// logging each step. devmgr, the code under test, is built for every run,
// as make e2e builds it: the go command's build cache makes that quick when
// the tree has not changed.
func build(dir string) (binaries, error) {
	var b binaries
	wd, err := os.Getwd()
	if err != nil {
		return b, err
	}
	cache, err := cluster.CacheDir()
	if err != nil {
		return b, err
	}
	for _, covered := range coveredDirs {
		if cache == covered || strings.HasPrefix(cache, covered+"/") {
			return b, fmt.Errorf("the cache %s is under %s, which the node's namespaces cover with a directory of their own: set %s elsewhere",
				cache, covered, cluster.CacheEnv)
		}
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return b, err
	}
	fmt.Println("node-e2e: building into", cache)
	var builds []cluster.Build
	if b.Binaries, builds, err = cluster.ControlPlane(cache); err != nil {
		return b, err
	}
	kubeVersion, err := cluster.ModuleVersion(wd, "k8s.io/kubernetes")
	if err != nil {
		return b, err
	}
	b.SamplePlugin = filepath.Join(cache, "sample-device-plugin-"+kubeVersion)
	builds = append(builds, cluster.Build{Dir: wd, Pkg: samplePluginPkg, Out: b.SamplePlugin})
	var log bytes.Buffer
	err = cluster.BuildAll(&log, builds...)
	fmt.Print(log.String())
	if err != nil {
		return b, err
	}
	if b.ContainerdDir, err = buildContainerd(filepath.Join(wd, "containerd"), cache); err != nil {
		return b, err
	}
	kubeletDir := filepath.Join(filepath.Dir(wd), "kubelet")
	v, err := cluster.ModuleVersion(kubeletDir, "k8s.io/kubernetes")
	if err != nil {
		return b, err
	}
	if v != kubeVersion {
		return b, fmt.Errorf("the kubelet module builds k8s.io/kubernetes %s, the control plane %s: pin one version in both", v, kubeVersion)
	}
	b.Kubelets = map[string]string{}
	for _, kind := range []string{devmgrKubelet, stockKubelet} {
		built, err := buildKubelet(kubeletDir, cache, kind == stockKubelet)
		if err != nil {
			return b, err
		}
		// The run keeps its own link: a build elsewhere that replaces
		// the cached binary does not pull it from under the run.
		b.Kubelets[kind] = filepath.Join(dir, filepath.Base(built))
		if err := linkOrCopy(built, b.Kubelets[kind]); err != nil {
			return b, fmt.Errorf("the kubelet into the run directory: %w", err)
		}
	}
	b.Devmgr = filepath.Join(dir, "devmgr")
	start := time.Now()
	if err := goBuild(filepath.Dir(wd), nil, "-o", b.Devmgr, "./cmd/devmgr"); err != nil {
		return b, err
	}
	fmt.Printf("build: devmgr of this tree in %s\n", time.Since(start).Round(time.Second))
	pause := filepath.Join(dir, "pause")
	if err := goBuild(wd, []string{"CGO_ENABLED=0"}, "-o", pause, "./pause"); err != nil {
		return b, err
	}
	busybox, err := busyboxLayer(staticBusybox)
	if err != nil {
		return b, err
	}
	pauseBin, err := os.ReadFile(pause)
	if err != nil {
		return b, err
	}
	for _, img := range []struct {
		name       string
		files      []imageFile
		entrypoint []string
	}{
		{busyboxImage, busybox, []string{"/bin/sh"}},
		{pauseImage, []imageFile{{name: "pause", mode: 0o755, body: pauseBin}}, []string{"/pause"}},
	} {
		out := filepath.Join(dir, filepath.Base(strings.ReplaceAll(img.name, ":", "_"))+".tar")
		if err := writeImage(out, img.name, img.files, img.entrypoint); err != nil {
			return b, err
		}
		b.Images = append(b.Images, out)
	}
	return b, nil
}

// buildContainerd builds containerd, its runc shim and ctr, static, at the
// version the module in modDir requires, into a directory of the cache
// named by that version, and returns the directory.
func buildContainerd(modDir, cache string) (string, error) {
	version, err := cluster.ModuleVersion(modDir, containerdModule)
	if err != nil {
		return "", err
	}
	out := filepath.Join(cache, "containerd-"+version)
	if _, err := os.Stat(out); err == nil {
		fmt.Printf("build: %s cached\n", filepath.Base(out))
		return out, nil
	}
	start := time.Now()
	tmp := fmt.Sprintf("%s.%d", out, os.Getpid())
	defer os.RemoveAll(tmp)
	if err := goBuild(modDir, []string{"CGO_ENABLED=0"}, "-o", tmp+"/",
		containerdModule+"/cmd/containerd", containerdModule+"/cmd/containerd-shim-runc-v2", containerdModule+"/cmd/ctr"); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, out); err != nil {
		return "", err
	}
	fmt.Printf("build: %s in %s\n", filepath.Base(out), time.Since(start).Round(time.Second))
	return out, nil
}

// buildKubelet runs make kubelet's builder (module kubeletDir) with the
// cache, and returns the path it prints last.
func buildKubelet(kubeletDir, cache string, stock bool) (string, error) {
	args := []string{"run", ".", "-cache", cache}
	if stock {
		args = append(args, "-stock")
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = kubeletDir
	cmd.Stderr = os.Stdout
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go %s (in %s): %w", strings.Join(args, " "), kubeletDir, err)
	}
	var last string
	for sc := bufio.NewScanner(bytes.NewReader(out)); sc.Scan(); {
		last = sc.Text()
	}
	if !filepath.IsAbs(last) {
		return "", fmt.Errorf("make kubelet's builder printed %q last, not a path", last)
	}
	return last, nil
}

// linkOrCopy hard-links from to to, or copies it where the two are on
// different file systems.
func linkOrCopy(from, to string) error {
	if os.Link(from, to) == nil {
		return nil
	}
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}

func goBuild(dir string, env []string, args ...string) error {
	cmd := exec.Command("go", append([]string{"build"}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

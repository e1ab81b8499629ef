// Command kubelet builds the kubelet of k8s.io/kubernetes (the version this
// module requires) with devmgr as its device manager, and prints the
// binary's path as its last line. With -stock it builds the same kubelet
// without the change, from the same module graph, for comparison.
//
// No fork of Kubernetes is kept. The build takes the kubelet's source from
// the module cache and gives the compiler two files through -overlay:
//   - cm/devmgr.go of this module, added to pkg/kubelet/cm as
//     devmgr_linux.go: newDevmgrDeviceManager, with the signature of the
//     kubelet's devicemanager.NewManagerImpl, returns devmgr behind the
//     kubelet's interface (the kubeletcompat module);
//   - pkg/kubelet/cm/container_manager_linux.go with its one call of
//     devicemanager.NewManagerImpl replaced by newDevmgrDeviceManager.
//
// The replacement is checked before every build: the kubelet's file must be
// the one it was written for, byte for byte (its SHA-256), so a new
// Kubernetes version fails here, naming the file, instead of building
// something else.
//
// Binaries are cached in -cache under names that carry the Kubernetes
// version and a hash of the build's inputs: this module's go.mod, go.sum
// and builder (the replaced line, the flags), the go command's version,
// platform, CGO_ENABLED, GOFLAGS and GOEXPERIMENT, the overlay, and the
// devmgr source compiled in, by path relative to the repository. A change
// to any of them builds again; the same tree, in any checkout, builds
// nothing. Each build removes the earlier builds of its kind.
package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"
)

const (
	kubeModule = "k8s.io/kubernetes"
	kubeletPkg = kubeModule + "/cmd/kubelet"
	// The version the overlay was written for, the file it changes, that
	// file's SHA-256 at that version, and the one line it replaces.
	writtenFor = "v1.37.2"
	target     = "pkg/kubelet/cm/container_manager_linux.go"
	targetSum  = "4b949fe82ff2df17250920a8f92b9a7c83f977f4378b8839f59c5770b780084c"
	oldCall    = "\tcm.deviceManager, err = devicemanager.NewManagerImpl(logger, machineInfo.Topology, cm.topologyManager)\n"
	newCall    = "\tcm.deviceManager, err = newDevmgrDeviceManager(logger, machineInfo.Topology, cm.topologyManager)\n"
	// added is the file the overlay adds to pkg/kubelet/cm, from this
	// module's cm/devmgr.go.
	added = "pkg/kubelet/cm/devmgr_linux.go"
	// devmgrModules are the modules whose source the kubelet compiles in
	// from this repository.
	devmgrModules = "github.com/openkubelet/devmgr github.com/openkubelet/devmgr/kubeletcompat"
)

func main() {
	stock := flag.Bool("stock", false, "build the kubelet without devmgr, from the same module graph")
	cache := flag.String("cache", "", "directory of the built kubelets (default: $DEVMGR_E2E_CACHE, else devmgr/e2e in the user's cache directory)")
	flag.Parse()
	path, err := build(*cache, *stock, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "make kubelet:", err)
		os.Exit(1)
	}
	fmt.Println(path)
}

// build builds the kubelet into cache, unless it is there already, and
// returns its path. It logs what it does to log.
func build(cache string, stock bool, log io.Writer) (string, error) {
	if cache == "" {
		var err error
		if cache, err = defaultCache(); err != nil {
			return "", err
		}
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", err
	}
	mod, err := kubernetes()
	if err != nil {
		return "", err
	}
	// The go command takes no overlay of a file in the module cache, so the
	// kubelet builds from a copy of the module (hard links where it can),
	// through a go.mod that replaces the module by that copy. The stock
	// kubelet builds from the same copy, so that the two builds share every
	// package the overlay leaves alone.
	src, err := sourceTree(cache, mod)
	if err != nil {
		return "", err
	}
	work, err := os.MkdirTemp(cache, "build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(work)
	modfile, err := writeModfile(work, src)
	if err != nil {
		return "", err
	}
	key := sha256.New()
	fmt.Fprintf(key, "go env:\n%s", goEnv())
	// The builder's own source holds the replaced line and the build flags.
	if err := hashFiles(key, "main.go", "go.mod", "go.sum"); err != nil {
		return "", err
	}
	name := "kubelet-" + mod.Version
	args := []string{"-modfile", modfile}
	if !stock {
		overlay, err := writeOverlay(work, src, mod.Version)
		if err != nil {
			return "", err
		}
		args = append(args, "-overlay", overlay)
		srcs, err := devmgrSources(args)
		if err != nil {
			return "", err
		}
		if err := hashFiles(key, append([]string{"cm/devmgr.go"}, srcs...)...); err != nil {
			return "", err
		}
		name += "-devmgr"
	}
	out := filepath.Join(cache, fmt.Sprintf("%s-%x", name, key.Sum(nil)[:6]))
	if _, err := os.Stat(out); err == nil {
		fmt.Fprintf(log, "kubelet: %s is built already\n", out)
		return out, nil
	}
	version := mod.Version
	if !stock {
		version += "+devmgr"
	}
	major, minor, _ := strings.Cut(strings.TrimPrefix(mod.Version, "v"), ".")
	minor, _, _ = strings.Cut(minor, ".")
	ldflags := fmt.Sprintf("-X k8s.io/component-base/version.gitVersion=%s -X k8s.io/component-base/version.gitMajor=%s -X k8s.io/component-base/version.gitMinor=%s",
		version, major, minor)
	// Built under a name of this build's and renamed, so that another build
	// sharing the cache never runs half a binary.
	tmp := fmt.Sprintf("%s.%d", out, os.Getpid())
	args = append([]string{"build", "-o", tmp, "-ldflags", ldflags}, args...)
	args = append(args, kubeletPkg)
	fmt.Fprintf(log, "kubelet: go %s (the first build takes several minutes)\n", strings.Join(args, " "))
	start := time.Now()
	cmd := exec.Command("go", args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Run(); err != nil {
		_ = os.Remove(tmp)
		return "", fmt.Errorf("go build %s: %w", kubeletPkg, err)
	}
	if err := os.Rename(tmp, out); err != nil {
		return "", err
	}
	fmt.Fprintf(log, "kubelet: built %s in %s\n", filepath.Base(out), time.Since(start).Round(time.Second))
	prune(cache, name, out, log)
	return out, nil
}

// defaultCache is $DEVMGR_E2E_CACHE, or devmgr/e2e in the user's cache
// directory: where make e2e and make node-e2e keep their components too.
func defaultCache() (string, error) {
	if dir := os.Getenv("DEVMGR_E2E_CACHE"); dir != "" {
		return filepath.Abs(dir)
	}
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no cache directory (give -cache or set DEVMGR_E2E_CACHE): %w", err)
	}
	return filepath.Join(dir, "devmgr", "e2e"), nil
}

type module struct {
	Version string
	Dir     string
}

// kubernetes is the k8s.io/kubernetes module this module selects,
// downloaded.
func kubernetes() (module, error) {
	var m module
	out, err := goCmd("mod", "download", "-json", kubeModule)
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(out, &m); err != nil {
		return m, fmt.Errorf("go mod download %s: %w", kubeModule, err)
	}
	return m, nil
}

// sourceTree returns a copy of the module's tree in cache, made once per
// version: hard links to the module cache's read-only files where the file
// system allows, copies elsewhere.
func sourceTree(cache string, mod module) (string, error) {
	dir := filepath.Join(cache, "src", "kubernetes-"+mod.Version)
	if _, err := os.Stat(dir); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), "tmp-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	err = filepath.WalkDir(mod.Dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(mod.Dir, path)
		if err != nil {
			return err
		}
		to := filepath.Join(tmp, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(to, 0o755)
		case d.Type().IsRegular():
			if os.Link(path, to) == nil {
				return nil
			}
			return copyFile(path, to)
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(path)
			if err != nil {
				return err
			}
			return os.Symlink(link, to)
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("copying %s: %w", mod.Dir, err)
	}
	// Another build may have made it meanwhile: then its copy stays.
	if err := os.Rename(tmp, dir); err != nil && !errors.Is(err, fs.ErrExist) && !errors.Is(err, syscall.ENOTEMPTY) {
		return "", err
	}
	return dir, nil
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o444)
}

// writeModfile writes into dir this module's go.mod with k8s.io/kubernetes
// replaced by src, and its go.sum beside it, and returns the go.mod's path
// (for the go command's -modfile).
func writeModfile(dir, src string) (string, error) {
	mod, err := os.ReadFile("go.mod")
	if err != nil {
		return "", err
	}
	sum, err := os.ReadFile("go.sum")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "kubelet.mod")
	mod = append(mod, fmt.Sprintf("\nreplace %s => %s\n", kubeModule, src)...)
	if err := os.WriteFile(path, mod, 0o644); err != nil {
		return "", err
	}
	return path, os.WriteFile(strings.TrimSuffix(path, ".mod")+".sum", sum, 0o644)
}

// writeOverlay checks the kubelet's file in src against the one the
// replacement was written for, writes the changed file and the overlay's
// JSON into dir, and returns the JSON's path.
func writeOverlay(dir, src, version string) (string, error) {
	orig, err := os.ReadFile(filepath.Join(src, target))
	if err != nil {
		return "", err
	}
	patched, err := patch(version, orig)
	if err != nil {
		return "", err
	}
	addedSrc, err := filepath.Abs(filepath.Join("cm", "devmgr.go"))
	if err != nil {
		return "", err
	}
	changed := filepath.Join(dir, filepath.Base(target))
	if err := os.WriteFile(changed, patched, 0o644); err != nil {
		return "", err
	}
	overlay, err := json.Marshal(map[string]map[string]string{"Replace": {
		filepath.Join(src, target): changed,
		filepath.Join(src, added):  addedSrc,
	}})
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "overlay.json")
	return path, os.WriteFile(path, overlay, 0o644)
}

// patch returns the kubelet's container_manager_linux.go with devmgr's
// constructor in place of the kubelet's device manager's. It refuses a
// version or a file other than the ones it was written for.
func patch(version string, orig []byte) ([]byte, error) {
	sum := sha256.Sum256(orig)
	if version != writtenFor || hex.EncodeToString(sum[:]) != targetSum {
		return nil, fmt.Errorf("the overlay was written for %s %s, whose %s has SHA-256 %s; this build has %s, whose file has %x: "+
			"check that the file still constructs the device manager with the line cm/devmgr.go replaces, then update writtenFor and targetSum in kubelet/main.go",
			kubeModule, writtenFor, target, targetSum, version, sum)
	}
	if n := bytes.Count(orig, []byte(oldCall)); n != 1 {
		return nil, fmt.Errorf("%s: the device manager's construction appears %d times, want 1", target, n)
	}
	return bytes.Replace(orig, []byte(oldCall), []byte(newCall), 1), nil
}

// devmgrSources lists the devmgr files compiled into the kubelet with the
// build flags flags.
func devmgrSources(flags []string) ([]string, error) {
	args := append([]string{"list", "-deps"}, flags...)
	args = append(args, "-f", `{{if .Module}}{{.Module.Path}}{{range .GoFiles}} {{$.Dir}}/{{.}}{{end}}{{end}}`, kubeletPkg)
	out, err := goCmd(args...)
	if err != nil {
		return nil, err
	}
	var files []string
	for line := range strings.Lines(string(out)) {
		fields := strings.Fields(line)
		if len(fields) > 1 && strings.Contains(" "+devmgrModules+" ", " "+fields[0]+" ") {
			files = append(files, fields[1:]...)
		}
	}
	if len(files) == 0 {
		return nil, errors.New("go list finds no devmgr source in the kubelet: is the overlay applied?")
	}
	return files, nil
}

// hashFiles writes each file's name, relative to the repository (so that
// two checkouts of the same tree agree), and content to h.
func hashFiles(h io.Writer, files ...string) error {
	root, err := filepath.Abs("..")
	if err != nil {
		return err
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		name, err := filepath.Abs(f)
		if err != nil {
			return err
		}
		if rel, err := filepath.Rel(root, name); err == nil {
			name = rel
		}
		fmt.Fprintf(h, "%s %d\n", name, len(b))
		_, _ = h.Write(b)
	}
	return nil
}

// prune removes the other builds named name in cache: earlier states of the
// tree, which no later build uses.
func prune(cache, name, keep string, log io.Writer) {
	old, _ := filepath.Glob(filepath.Join(cache, name+"-*"))
	for _, f := range old {
		sum := strings.TrimPrefix(filepath.Base(f), name+"-")
		if _, err := hex.DecodeString(sum); err != nil || len(sum) != 12 || f == keep {
			continue // another kind of build, or this one
		}
		if os.Remove(f) == nil {
			fmt.Fprintf(log, "kubelet: removed the earlier build %s\n", filepath.Base(f))
		}
	}
}

// goEnv is what of the go command's environment changes the binary.
func goEnv() string {
	out, err := goCmd("env", "GOVERSION", "GOOS", "GOARCH", "CGO_ENABLED", "GOFLAGS", "GOEXPERIMENT")
	if err != nil {
		return runtime.Version()
	}
	return string(out)
}

func goCmd(args ...string) ([]byte, error) {
	cmd := exec.Command("go", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	return out, nil
}

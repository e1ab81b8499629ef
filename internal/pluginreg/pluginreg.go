// Package pluginreg holds the rules a device plugin's RegisterRequest must
// meet, with the kubelet's error messages: the manager applies them to every
// registration, and the sanity suite to the plugin under test.
package pluginreg

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// MaxSocketPath is the longest unix socket path Linux accepts (sun_path holds
// 108 bytes including the terminating NUL).
const MaxSocketPath = 107

// SupportedVersions are the device-plugin API versions a manager speaks.
var SupportedVersions = []string{pluginapi.Version}

// CheckVersion accepts a supported API version only.
func CheckVersion(v string) error {
	if !slices.Contains(SupportedVersions, v) {
		return fmt.Errorf("requested API version %q is not supported by kubelet. Supported version is %q", v, SupportedVersions)
	}
	return nil
}

// CheckResourceName accepts extended resource names only, as the kubelet
// does: domain/name, outside kubernetes.io, not "requests."-prefixed, and a
// qualified name once prefixed with "requests.".
func CheckResourceName(name string) error {
	if !IsExtendedResourceName(name) {
		return fmt.Errorf("the ResourceName %q is invalid", name)
	}
	return nil
}

// IsExtendedResourceName reports whether CheckResourceName accepts name.
func IsExtendedResourceName(name string) bool {
	if !strings.Contains(name, "/") || strings.Contains(name, "kubernetes.io/") ||
		strings.HasPrefix(name, "requests.") {
		return false
	}
	return len(validation.IsQualifiedName("requests."+name)) == 0
}

// EndpointPath turns a registration's endpoint into the plugin's socket path
// in dir. The endpoint must be a bare file name: anything that could leave
// dir ("/", "..", ".", empty) or that no socket can be named (NUL) is
// refused, and the path must fit in a unix socket address.
func EndpointPath(dir, ep string) (string, error) {
	switch {
	case ep == "", ep == ".", ep == "..":
		return "", fmt.Errorf("invalid endpoint %q: must be a file name in %s", ep, dir)
	case strings.ContainsAny(ep, "/\x00"):
		return "", fmt.Errorf("invalid endpoint %q: must be a file name in %s, without '/' or NUL", ep, dir)
	}
	path := filepath.Join(dir, ep)
	if len(path) > MaxSocketPath {
		return "", fmt.Errorf("invalid endpoint %q: socket path is %d bytes, the limit is %d", ep, len(path), MaxSocketPath)
	}
	return path, nil
}

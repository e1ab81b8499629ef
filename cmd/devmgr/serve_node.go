package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/dra"
	"github.com/openkubelet/devmgr/nodestatus"
)

// envKubeconfig names the environment variable --kubeconfig defaults to: a
// list of kubeconfig files, as for kubectl.
const envKubeconfig = "KUBECONFIG"

// nodeOptions are the flags of "devmgr serve" that publish the devices in a
// Node's status.
type nodeOptions struct {
	kubeconfig string
	// kubeconfigFromEnv: kubeconfig is $KUBECONFIG, --kubeconfig being
	// absent.
	kubeconfigFromEnv bool
	nodeName          string
	registerNode      bool
	noNodeStatus      bool
	dra               bool
	draDriver         string
	draDeviceClasses  bool
	// draFlagsSet: one of draFlags was given.
	draFlagsSet    bool
	draRegistryDir string
	draPluginDir   string
	cdiDir         string
	// hostname returns the host name, the default of --node-name;
	// os.Hostname when nil.
	hostname func() (string, error)
}

func (o *nodeOptions) addFlags(f *pflag.FlagSet) {
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "publish the device resources (capacity and allocatable) in the status of the Node --node-name of the cluster this kubeconfig file reaches, by server-side apply as field manager \""+nodestatus.DefaultFieldManager+"\" (default: $"+envKubeconfig+", files as kubectl reads it, so serve publishes wherever $"+envKubeconfig+" is set; --kubeconfig= publishes nothing)")
	f.StringVar(&o.nodeName, "node-name", "", "the Node whose status carries the device resources, with --kubeconfig or $"+envKubeconfig+" (default: the host name, lower-cased, as the kubelet's)")
	f.BoolVar(&o.registerNode, "register-node", false, "create the Node --node-name when it does not exist (default: wait for it)")
	f.BoolVar(&o.dra, "dra", false, "also be the DRA driver --dra-driver for the plugins' devices: publish the healthy devices no pod holds as ResourceSlices, one pool per resource (named NODE/RESOURCE), so that the scheduler can allocate ResourceClaims from them, and prepare the claims for the kubelet through the plugins' Allocate; needs --kubeconfig or $"+envKubeconfig)
	f.StringVar(&o.draDriver, "dra-driver", dra.DefaultDriverName, "the DRA driver name of --dra's ResourceSlices")
	f.BoolVar(&o.draDeviceClasses, "dra-device-classes", false, "with --dra, create a DeviceClass for each resource that has none (named after the resource, example.com-gpu), with the resource as its extendedResourceName, so that pods asking for example.com/gpu as before are served through DRA; needs --no-node-status (a node that advertises the resource is served the device-plugin way)")
	f.BoolVar(&o.noNodeStatus, "no-node-status", false, "with --kubeconfig, do not publish the device resources in the Node status (a kubelet beside serve owns it, or --dra-device-classes serves them through DRA)")
	f.StringVar(&o.draRegistryDir, "dra-registry-dir", kubeletplugin.KubeletRegistryDir, "with --dra, the kubelet's plugins registry, where the DRA driver registers so that the kubelet asks it to prepare claims")
	f.StringVar(&o.draPluginDir, "dra-plugin-dir", "", "with --dra, the directory of the socket the kubelet calls to prepare claims (default "+kubeletplugin.KubeletPluginsDir+"/DRIVER)")
	f.StringVar(&o.cdiDir, "cdi-dir", dra.DefaultCDIDir, "with --dra, where the CDI specs of prepared claims are written (a directory the container runtime reads)")
}

// fromEnvironment takes $KUBECONFIG, as getenv gives it, for --kubeconfig
// when the flag is absent from f. --kubeconfig= (empty) publishes nothing,
// whatever the environment.
func (o *nodeOptions) fromEnvironment(f *pflag.FlagSet, getenv func(string) string) {
	if f.Changed("kubeconfig") {
		return
	}
	if v := getenv(envKubeconfig); v != "" {
		o.kubeconfig, o.kubeconfigFromEnv = v, true
	}
}

// nodeConfig is nodeOptions checked; client is nil when nothing is
// published.
type nodeConfig struct {
	client kubernetes.Interface
	// kubeconfigSource says, for the log, where the kubeconfig came from.
	kubeconfigSource string
	nodeName         string
	registerNode     bool
	// nodeStatus: the device resources are published in the Node status.
	nodeStatus bool
	// draDriver is the DRA driver name; "" when serve is no DRA driver.
	draDriver                            string
	draRegistryDir, draPluginDir, cdiDir string
	draDeviceClasses                     bool
}

// nodeRequestTimeout bounds each request to the API server.
const nodeRequestTimeout = 30 * time.Second

// draFlags are the flags that mean something only with --dra.
var draFlags = []string{"dra-driver", "dra-device-classes", "dra-registry-dir", "dra-plugin-dir", "cdi-dir"}

func (o *nodeOptions) config() (nodeConfig, error) {
	switch {
	case o.draFlagsSet && !o.dra:
		return nodeConfig{}, errors.New("--" + strings.Join(draFlags, ", --") + " need --dra")
	case o.draDeviceClasses && !o.noNodeStatus:
		return nodeConfig{}, errors.New("--dra-device-classes needs --no-node-status: the scheduler serves a resource the Node status advertises the device-plugin way, not through DRA")
	case o.registerNode && o.noNodeStatus:
		return nodeConfig{}, errors.New("--register-node needs the Node status: it is the status publisher that registers the Node")
	}
	if o.kubeconfig == "" {
		switch {
		case o.nodeName != "":
			return nodeConfig{}, errors.New("--node-name needs --kubeconfig or $" + envKubeconfig)
		case o.registerNode:
			return nodeConfig{}, errors.New("--register-node needs --kubeconfig or $" + envKubeconfig)
		case o.dra:
			return nodeConfig{}, errors.New("--dra needs --kubeconfig or $" + envKubeconfig)
		}
		return nodeConfig{}, nil
	}
	nodeName, err := o.node()
	if err != nil {
		return nodeConfig{}, err
	}
	rc, source, err := o.restConfig()
	if err != nil {
		return nodeConfig{}, err
	}
	rc.UserAgent = "devmgr"
	rc.Timeout = nodeRequestTimeout
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nodeConfig{}, fmt.Errorf("%s: %w", source, err)
	}
	cfg := nodeConfig{client: client, kubeconfigSource: source, nodeName: nodeName, registerNode: o.registerNode,
		nodeStatus: !o.noNodeStatus, draDeviceClasses: o.draDeviceClasses}
	if o.dra {
		if errs := validation.IsDNS1123Subdomain(o.draDriver); len(errs) > 0 {
			return nodeConfig{}, fmt.Errorf("--dra-driver %q is not a valid driver name: %s", o.draDriver, strings.Join(errs, "; "))
		}
		cfg.draDriver, cfg.draRegistryDir, cfg.draPluginDir, cfg.cdiDir = o.draDriver, o.draRegistryDir, o.draPluginDir, o.cdiDir
	}
	return cfg, nil
}

// node returns --node-name or, without it, the host name lower-cased and
// trimmed, as the kubelet's default; either must be a valid node name.
func (o *nodeOptions) node() (string, error) {
	if o.nodeName != "" {
		if errs := validation.IsDNS1123Subdomain(o.nodeName); len(errs) > 0 {
			return "", fmt.Errorf("--node-name %q is not a valid node name: %s", o.nodeName, strings.Join(errs, "; "))
		}
		return o.nodeName, nil
	}
	hostname := o.hostname
	if hostname == nil {
		hostname = os.Hostname
	}
	h, err := hostname()
	if err != nil {
		return "", &exitError{code: exitFailure, err: fmt.Errorf("--node-name defaults to the host name: %w; set --node-name", err)}
	}
	name := strings.ToLower(strings.TrimSpace(h))
	if name == "" {
		return "", errors.New("--node-name defaults to the host name, which is empty; set --node-name")
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return "", fmt.Errorf("--node-name defaults to the host name %q, which is not a valid node name: %s; set --node-name",
			name, strings.Join(errs, "; "))
	}
	return name, nil
}

// restConfig reads the kubeconfig: the file --kubeconfig, or the files of
// $KUBECONFIG merged as kubectl merges them, skipping those that do not
// exist. It returns where the kubeconfig came from, to name it in errors and
// the log.
func (o *nodeOptions) restConfig() (*rest.Config, string, error) {
	source := "--kubeconfig " + o.kubeconfig
	rules := &clientcmd.ClientConfigLoadingRules{ExplicitPath: o.kubeconfig}
	if o.kubeconfigFromEnv {
		source = "$" + envKubeconfig + "=" + o.kubeconfig
		files := filepath.SplitList(o.kubeconfig)
		// None there is an error rather than nothing published: the
		// environment asked to publish.
		if !slices.ContainsFunc(files, func(f string) bool { _, err := os.Stat(f); return err == nil }) {
			return nil, source, &exitError{code: exitFailure, err: fmt.Errorf(
				"%s: no such file; set --kubeconfig, or --kubeconfig= to publish nothing", source)}
		}
		rules = &clientcmd.ClientConfigLoadingRules{Precedence: files}
	} else if _, err := os.Stat(o.kubeconfig); err != nil {
		return nil, source, &exitError{code: exitFailure, err: fmt.Errorf("--kubeconfig: %w", err)}
	}
	rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, source, fmt.Errorf("%s: %w", source, err)
	}
	return rc, source, nil
}

// newSlicePublisher returns the publisher of the ResourceSlices, nil when
// none is configured.
func newSlicePublisher(cfg serveConfig, mgr *devicemanager.ManagerImpl, logger klog.Logger) (*dra.SlicePublisher, error) {
	if cfg.draDriver == "" {
		return nil, nil
	}
	p, err := dra.NewSlicePublisher(dra.SlicePublisherOptions{
		Manager:       mgr,
		Client:        cfg.client,
		NodeName:      cfg.nodeName,
		DriverName:    cfg.draDriver,
		DeviceClasses: cfg.draDeviceClasses,
		Logger:        logger.WithName("dra"),
	})
	if err != nil {
		return nil, fmt.Errorf("dra: %w", err)
	}
	return p, nil
}

// startDRADriver starts the DRA driver that prepares claims for the
// kubelet, nil when none is configured.
func startDRADriver(ctx context.Context, cfg serveConfig, mgr *devicemanager.ManagerImpl, logger klog.Logger) (*dra.Driver, error) {
	if cfg.draDriver == "" {
		return nil, nil
	}
	d, err := dra.StartDriver(ctx, dra.DriverOptions{
		Manager:     mgr,
		Client:      cfg.client,
		NodeName:    cfg.nodeName,
		DriverName:  cfg.draDriver,
		RegistryDir: cfg.draRegistryDir,
		PluginDir:   cfg.draPluginDir,
		CDIDir:      cfg.cdiDir,
		Logger:      logger.WithName("dra"),
	})
	if err != nil {
		return nil, err
	}
	logger.Info("Serving the DRA driver", "driver", cfg.draDriver, "socketPath", d.SocketPath(), "registryDir", cfg.draRegistryDir, "cdiDir", cfg.cdiDir)
	return d, nil
}

// newPublisher returns the publisher of the node's device resources, nil
// when none is configured. It must be made before the manager starts (see
// nodestatus.New).
func newPublisher(cfg serveConfig, mgr *devicemanager.ManagerImpl, logger klog.Logger) (*nodestatus.Publisher, error) {
	if cfg.client == nil || !cfg.nodeStatus {
		return nil, nil
	}
	metrics, err := nodestatus.NewMetrics(cfg.registerer())
	if err != nil {
		return nil, fmt.Errorf("node status metrics: %w", err)
	}
	p, err := nodestatus.New(nodestatus.Options{
		Client:       cfg.client,
		NodeName:     cfg.nodeName,
		Manager:      mgr,
		RegisterNode: cfg.registerNode,
		Metrics:      metrics,
		Logger:       logger.WithName("nodestatus"),
	})
	if err != nil {
		return nil, fmt.Errorf("node status: %w", err)
	}
	return p, nil
}

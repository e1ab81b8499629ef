package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/dra"
	"github.com/openkubelet/devmgr/nodestatus"
)

// nodeOptions are the flags of "devmgr serve" that publish the devices in a
// Node's status.
type nodeOptions struct {
	kubeconfig   string
	nodeName     string
	registerNode bool
	dra          bool
	draDriver    string
}

func (o *nodeOptions) addFlags(f *pflag.FlagSet) {
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "publish the device resources (capacity and allocatable) in the status of the Node --node-name of the cluster this kubeconfig file reaches, by server-side apply as field manager \""+nodestatus.DefaultFieldManager+"\" (default: not published)")
	f.StringVar(&o.nodeName, "node-name", "", "the Node whose status carries the device resources; required with --kubeconfig")
	f.BoolVar(&o.registerNode, "register-node", false, "create the Node --node-name when it does not exist (default: wait for it)")
	f.BoolVar(&o.dra, "dra", false, "also publish the plugins' healthy, unallocated devices as ResourceSlices of the DRA driver --dra-driver, one pool per resource (named NODE/RESOURCE), so that the scheduler can allocate ResourceClaims from them; needs --kubeconfig")
	f.StringVar(&o.draDriver, "dra-driver", dra.DefaultDriverName, "the DRA driver name of --dra's ResourceSlices")
}

// nodeConfig is nodeOptions checked; client is nil when nothing is
// published.
type nodeConfig struct {
	client       kubernetes.Interface
	nodeName     string
	registerNode bool
	// draDriver is the DRA driver name of the ResourceSlices; "" when
	// none are published.
	draDriver string
}

// nodeRequestTimeout bounds each request to the API server.
const nodeRequestTimeout = 30 * time.Second

func (o *nodeOptions) config() (nodeConfig, error) {
	if o.kubeconfig == "" {
		switch {
		case o.nodeName != "":
			return nodeConfig{}, errors.New("--node-name needs --kubeconfig")
		case o.registerNode:
			return nodeConfig{}, errors.New("--register-node needs --kubeconfig")
		case o.dra:
			return nodeConfig{}, errors.New("--dra needs --kubeconfig")
		}
		return nodeConfig{}, nil
	}
	if o.nodeName == "" {
		return nodeConfig{}, errors.New("--kubeconfig needs --node-name")
	}
	if errs := validation.IsDNS1123Subdomain(o.nodeName); len(errs) > 0 {
		return nodeConfig{}, fmt.Errorf("--node-name %q is not a valid node name: %s", o.nodeName, strings.Join(errs, "; "))
	}
	if _, err := os.Stat(o.kubeconfig); err != nil {
		return nodeConfig{}, &exitError{code: exitFailure, err: fmt.Errorf("--kubeconfig: %w", err)}
	}
	rc, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return nodeConfig{}, fmt.Errorf("--kubeconfig %s: %w", o.kubeconfig, err)
	}
	rc.UserAgent = "devmgr"
	rc.Timeout = nodeRequestTimeout
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nodeConfig{}, fmt.Errorf("--kubeconfig %s: %w", o.kubeconfig, err)
	}
	cfg := nodeConfig{client: client, nodeName: o.nodeName, registerNode: o.registerNode}
	if o.dra {
		if errs := validation.IsDNS1123Subdomain(o.draDriver); len(errs) > 0 {
			return nodeConfig{}, fmt.Errorf("--dra-driver %q is not a valid driver name: %s", o.draDriver, strings.Join(errs, "; "))
		}
		cfg.draDriver = o.draDriver
	}
	return cfg, nil
}

// newSlicePublisher returns the publisher of the ResourceSlices, nil when
// none is configured.
func newSlicePublisher(cfg serveConfig, mgr *devicemanager.ManagerImpl, logger klog.Logger) (*dra.SlicePublisher, error) {
	if cfg.draDriver == "" {
		return nil, nil
	}
	p, err := dra.NewSlicePublisher(dra.SlicePublisherOptions{
		Manager:    mgr,
		Client:     cfg.client,
		NodeName:   cfg.nodeName,
		DriverName: cfg.draDriver,
		Logger:     logger.WithName("dra"),
	})
	if err != nil {
		return nil, fmt.Errorf("dra: %w", err)
	}
	return p, nil
}

// newPublisher returns the publisher of the node's device resources, nil
// when none is configured. It must be made before the manager starts (see
// nodestatus.New).
func newPublisher(cfg serveConfig, mgr *devicemanager.ManagerImpl, logger klog.Logger) (*nodestatus.Publisher, error) {
	if cfg.client == nil {
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

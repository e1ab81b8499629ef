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
	"github.com/openkubelet/devmgr/nodestatus"
)

// nodeOptions are the flags of "devmgr serve" that publish the devices in a
// Node's status.
type nodeOptions struct {
	kubeconfig   string
	nodeName     string
	registerNode bool
}

func (o *nodeOptions) addFlags(f *pflag.FlagSet) {
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "publish the device resources (capacity and allocatable) in the status of the Node --node-name of the cluster this kubeconfig file reaches, by server-side apply as field manager \""+nodestatus.DefaultFieldManager+"\" (default: not published)")
	f.StringVar(&o.nodeName, "node-name", "", "the Node whose status carries the device resources; required with --kubeconfig")
	f.BoolVar(&o.registerNode, "register-node", false, "create the Node --node-name when it does not exist (default: wait for it)")
}

// nodeConfig is nodeOptions checked; client is nil when nothing is
// published.
type nodeConfig struct {
	client       kubernetes.Interface
	nodeName     string
	registerNode bool
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
	return nodeConfig{client: client, nodeName: o.nodeName, registerNode: o.registerNode}, nil
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

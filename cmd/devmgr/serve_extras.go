package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/time/rate"
	"k8s.io/klog/v2"

	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/podadmit"
	"github.com/openkubelet/devmgr/podresources"
	"github.com/openkubelet/devmgr/topology"
	"github.com/openkubelet/devmgr/topology/policy"
)

// extraOptions are the flags of "devmgr serve" for what surrounds the device
// manager on a node: the podresources API, metrics, the plugins registry.
type extraOptions struct {
	podresourcesSocket string
	podresourcesQPS    float64
	podresourcesBurst  int
	metricsAddress     string
	pluginsRegistryDir string
	topologyPolicy     string
	topologyScope      string
}

func (o *extraOptions) addFlags(f *pflag.FlagSet) {
	f.StringVar(&o.podresourcesSocket, "podresources-socket", "", "serve the kubelet's podresources v1 API (List, GetAllocatableResources, Get) for the admitted pods on this unix socket (default: not served; the kubelet uses /var/lib/kubelet/pod-resources/kubelet.sock)")
	f.Float64Var(&o.podresourcesQPS, "podresources-qps", podresources.DefaultQPS, "podresources calls allowed per second, on average; calls over the limit fail with ResourceExhausted (0 or less: no limit)")
	f.IntVar(&o.podresourcesBurst, "podresources-burst", podresources.DefaultBurst, "podresources calls allowed at once, above --podresources-qps")
	f.StringVar(&o.metricsAddress, "metrics-address", "", "serve Prometheus metrics at http://ADDRESS/metrics, such as 127.0.0.1:9400, and probes: /healthz answers 200 while serve runs, /readyz 200 once the checkpoint is read and the sockets serve, 503 before and after (port 0 picks a free port; the bound address is logged; default: not served)")
	f.StringVar(&o.topologyPolicy, "topology-policy", policy.None, "the topology manager policy applied to admissions: "+orList(topologyPolicies)+" (hints from the device manager, over --numa-nodes); the chosen NUMA affinity aligns the allocation")
	f.StringVar(&o.topologyScope, "topology-scope", scopeContainer, "the scope of --topology-policy: container (each container aligned on its own, as it is admitted) or pod (one affinity for all of a pod's containers, from their requests together), as the kubelet's --topology-manager-scope")
	f.StringVar(&o.pluginsRegistryDir, "plugins-registry-dir", "", "also accept plugins that register through the pluginregistration protocol in this directory, as the kubelet's /var/lib/kubelet/plugins_registry (default: only kubelet.sock)")
}

// extraConfig is extraOptions checked.
type extraConfig struct {
	podresourcesSocket string
	// podresourcesQPS and podresourcesBurst limit the rate of podresources
	// calls; a QPS of 0: no limit.
	podresourcesQPS    float64
	podresourcesBurst  int
	metricsAddress     string
	pluginsRegistryDir string
	metrics            *prometheus.Registry
	// policy is the topology policy; store records its decisions (nil for
	// the none policy). podScope: one affinity per pod.
	policy   policy.Policy
	store    *policy.Store
	podScope bool
}

// The values of --topology-scope.
const (
	scopeContainer = "container"
	scopePod       = "pod"
)

// topologyPolicies are the values of --topology-policy, the kubelet's
// --topology-manager-policy names.
var topologyPolicies = []string{policy.None, policy.BestEffort, policy.Restricted, policy.SingleNUMANode}

// addCompletions makes shell completion offer the values of the flags that
// take one of a few names.
func (o *extraOptions) addCompletions(cmd *cobra.Command) error {
	return errors.Join(
		cmd.RegisterFlagCompletionFunc("topology-policy", cobra.FixedCompletions(topologyPolicies, cobra.ShellCompDirectiveNoFileComp)),
		cmd.RegisterFlagCompletionFunc("topology-scope", cobra.FixedCompletions([]string{scopeContainer, scopePod}, cobra.ShellCompDirectiveNoFileComp)),
	)
}

// orList joins names as "a, b or c".
func orList(names []string) string {
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

func (o *extraOptions) config(base serveConfig) (extraConfig, error) {
	cfg := extraConfig{metricsAddress: o.metricsAddress}
	if o.podresourcesQPS > 0 {
		if o.podresourcesBurst < 1 {
			return cfg, fmt.Errorf("--podresources-burst must be at least 1 with a --podresources-qps limit, not %d", o.podresourcesBurst)
		}
		cfg.podresourcesQPS, cfg.podresourcesBurst = o.podresourcesQPS, o.podresourcesBurst
	}
	if o.podresourcesSocket != "" {
		p, err := filepath.Abs(o.podresourcesSocket)
		if err != nil {
			return cfg, fmt.Errorf("--podresources-socket: %w", err)
		}
		switch {
		case len(p) > maxSocketPath:
			return cfg, fmt.Errorf("--podresources-socket %s is %d bytes long; a unix socket path holds at most %d", p, len(p), maxSocketPath)
		case filepath.Dir(p) == base.socketDir:
			return cfg, fmt.Errorf("--podresources-socket %s is in --socket-dir, where stale sockets are removed at start; choose another directory", p)
		case p == base.controlSocket:
			return cfg, fmt.Errorf("--podresources-socket %s is the control socket; choose another path", p)
		}
		cfg.podresourcesSocket = p
	}
	if o.pluginsRegistryDir != "" {
		d, err := absDir("--plugins-registry-dir", o.pluginsRegistryDir)
		if err != nil {
			return cfg, err
		}
		cfg.pluginsRegistryDir = d
	}
	name := o.topologyPolicy
	if name == "" {
		name = policy.None
	}
	p, err := policy.New(name, base.numaNodes)
	switch {
	case errors.Is(err, policy.ErrUnknown):
		return cfg, fmt.Errorf("--topology-policy: unknown policy %q: want %s", name, orList(topologyPolicies))
	case err != nil:
		return cfg, fmt.Errorf("--topology-policy: %w", err)
	}
	cfg.policy = p
	if p.Name() != policy.None {
		cfg.store = policy.NewStore()
	}
	switch o.topologyScope {
	case scopeContainer, "":
	case scopePod:
		cfg.podScope = true
	default:
		return cfg, fmt.Errorf("--topology-scope: unknown scope %q: want %s or %s", o.topologyScope, scopeContainer, scopePod)
	}
	if o.metricsAddress != "" {
		if _, _, err := net.SplitHostPort(o.metricsAddress); err != nil {
			return cfg, fmt.Errorf("--metrics-address: %w", err)
		}
		cfg.metrics = prometheus.NewRegistry()
		cfg.metrics.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	return cfg, nil
}

// affinityStore returns where the manager reads the chosen NUMA affinities;
// nil without a topology policy.
func (c extraConfig) affinityStore() topology.AffinityStore {
	if c.store == nil {
		return nil
	}
	return c.store
}

// registerer returns where the manager registers its metrics; nil when
// metrics are not served.
func (c extraConfig) registerer() prometheus.Registerer {
	if c.metrics == nil {
		return nil
	}
	return c.metrics
}

// extras are the optional servers of a running "devmgr serve".
type extras struct {
	podresources *podresources.Server
	metrics      *http.Server
	done         chan struct{}
	log          klog.Logger
}

// readiness is what /readyz reports: ready while the control socket serves
// (it starts once the checkpoint and the admitted pods are read and the
// other sockets serve, and stops first at shutdown) and the manager's
// registration server serves.
type readiness struct {
	serving atomic.Bool
	health  func() error // the manager's HealthCheck
}

func (r *readiness) check() error {
	if !r.serving.Load() {
		return errors.New("the control socket is not serving")
	}
	return r.health()
}

// metricsHandler serves /metrics of reg and the probes, whose bodies are
// short text as the kubelet's /healthz.
func metricsHandler(reg *prometheus.Registry, ready func() error) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeText(w, http.StatusOK, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			writeText(w, http.StatusServiceUnavailable, "not ready: "+err.Error())
			return
		}
		writeText(w, http.StatusOK, "ok")
	})
	return mux
}

func writeText(w http.ResponseWriter, code int, text string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = fmt.Fprintln(w, text)
}

// startExtras starts the podresources server and the metrics server; ready
// is what /readyz reports.
func startExtras(cfg serveConfig, mgr *devicemanager.ManagerImpl, adm *podadmit.Admitter, ready func() error, logger klog.Logger) (_ *extras, err error) {
	ex := &extras{log: logger}
	defer func() {
		if err != nil {
			ex.stop()
		}
	}()
	if cfg.podresourcesSocket != "" {
		opts := podresources.Options{Registerer: cfg.registerer(), Logger: logger.WithName("podresources")}
		if cfg.podresourcesQPS > 0 {
			opts.Limiter = rate.NewLimiter(rate.Limit(cfg.podresourcesQPS), cfg.podresourcesBurst)
		}
		srv, err := podresources.NewServer(mgr, podresources.PodsFunc(adm.ActivePods), opts)
		if err != nil {
			return nil, fmt.Errorf("podresources: %w", err)
		}
		if err := srv.Start(cfg.podresourcesSocket); err != nil {
			return nil, fmt.Errorf("podresources: %w", err)
		}
		ex.podresources = srv
		if !logger.V(2).Enabled() { // else the server has said it
			logger.Info("Serving the podresources API", "socketPath", cfg.podresourcesSocket, "qps", cfg.podresourcesQPS, "burst", cfg.podresourcesBurst)
		}
	}
	if cfg.metrics != nil {
		lis, err := net.Listen("tcp", cfg.metricsAddress)
		if err != nil {
			return nil, fmt.Errorf("--metrics-address: %w", err)
		}
		ex.metrics = &http.Server{Handler: metricsHandler(cfg.metrics, ready), ReadHeaderTimeout: 10 * time.Second}
		ex.done = make(chan struct{})
		go func() {
			defer close(ex.done)
			if err := ex.metrics.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
				logger.Error(err, "Metrics server stopped")
			}
		}()
		base := "http://" + lis.Addr().String()
		logger.Info("Serving metrics", "address", lis.Addr().String(), "url", base+"/metrics", "healthz", base+"/healthz", "readyz", base+"/readyz")
	}
	return ex, nil
}

// stop stops the optional servers and waits for them.
func (ex *extras) stop() {
	if ex == nil {
		return
	}
	if ex.podresources != nil {
		if err := ex.podresources.Stop(); err != nil {
			ex.log.Error(err, "Stopping podresources")
		}
	}
	if ex.metrics != nil {
		ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
		if err := ex.metrics.Shutdown(ctx); err != nil {
			_ = ex.metrics.Close()
		}
		cancel()
		<-ex.done
		ex.metrics = nil
	}
}

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/podadmit"
	"github.com/openkubelet/devmgr/topology/policy"
)

// maxPodBytes bounds a request body.
const maxPodBytes = 4 << 20

// notReadyRetryAfter is the Retry-After of an admission refused because a
// resource's plugin is not ready: plugins register again within seconds of
// kubelet.sock appearing.
const notReadyRetryAfter = 5 * time.Second

// controlServer serves the control API (see control.go) for one manager and
// the node of pods admitted through it. Its handlers are safe for concurrent
// use: the manager and the node are.
type controlServer struct {
	status   func() []devicemanager.ResourceStatus
	admitter *podadmit.Admitter
	info     managerJSON
	// record saves the admitted pods after an admission or a release changed
	// them; nil saves nothing.
	record func() error
	log    klog.Logger
}

func (s *controlServer) handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(pathStatus, methods{http.MethodGet: s.getStatus})
	mux.Handle(pathPods, methods{http.MethodGet: s.listPods, http.MethodPost: s.admit})
	mux.Handle(pathPods+"/{uid}", methods{http.MethodGet: s.getPod, http.MethodDelete: s.release})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, errorResponse{
			Error:  fmt.Sprintf("no such path %s; the API serves %s and %s", r.URL.Path, pathStatus, pathPods),
			Reason: reasonNotFound,
		})
	})
	return mux
}

// methods routes a path's requests by method, answering 405 in JSON for the
// others.
type methods map[string]http.HandlerFunc

func (m methods) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h, ok := m[r.Method]; ok {
		h(w, r)
		return
	}
	allowed := make([]string, 0, len(m))
	for method := range m {
		allowed = append(allowed, method)
	}
	slices.Sort(allowed)
	w.Header().Set("Allow", strings.Join(allowed, ", "))
	writeJSON(w, http.StatusMethodNotAllowed, errorResponse{
		Error:  fmt.Sprintf("method %s is not allowed on %s; use %s", r.Method, r.URL.Path, strings.Join(allowed, " or ")),
		Reason: reasonMethodNotAllowed,
	})
}

func (s *controlServer) getStatus(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, toStatusResponse(s.status(), s.info))
}

func (s *controlServer) listPods(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, toPodsResponse(s.admitter.Pods()))
}

func (s *controlServer) getPod(w http.ResponseWriter, r *http.Request) {
	uid := r.PathValue("uid")
	a, ok := s.admitter.Pod(types.UID(uid))
	if !ok {
		writeJSON(w, http.StatusNotFound, podNotFound(uid))
		return
	}
	writeJSON(w, http.StatusOK, toAdmissionResponse(a))
}

// admit admits the pod in the body: every init container then every app
// container, in order. A pod admitted already gets its first answer again.
func (s *controlServer) admit(w http.ResponseWriter, r *http.Request) {
	pod, err := decodePod(http.MaxBytesReader(w, r.Body, maxPodBytes))
	if err != nil {
		writeJSON(w, http.StatusUnprocessableEntity, errorResponse{Error: err.Error(), Reason: reasonInvalidPod})
		return
	}
	known := false
	if pod.UID != "" {
		if old, ok := s.admitter.AdmittedPod(pod.UID); ok {
			if !sameRequests(old, pod) {
				writeJSON(w, http.StatusUnprocessableEntity, errorResponse{
					Error: fmt.Sprintf("pod %s is already admitted with other containers or device requests; release it first",
						pod.UID),
					Reason: reasonRequestChanged,
				})
				return
			}
			known = true
		}
	}
	ns := pod.Namespace
	if ns == "" {
		ns = "default" // as Admit defaults it
	}
	log := s.log.WithValues("pod", klog.KRef(ns, pod.Name))
	a, err := s.admitter.Admit(r.Context(), pod)
	if err != nil {
		code, resp := admissionError(err)
		log.Info("Refused pod", "podUID", pod.UID, "containerName", resp.Container, "err", resp.Error)
		if resp.Reason == reasonPluginNotReady {
			w.Header().Set("Retry-After", strconv.Itoa(int(notReadyRetryAfter/time.Second)))
		}
		writeJSON(w, code, resp)
		return
	}
	if !known && s.record != nil {
		if err := s.record(); err != nil {
			// A pod that would not come back after a restart must not hold
			// devices now.
			s.admitter.Release(a.UID)
			log.Error(err, "Refused pod: cannot save the admitted pods", "podUID", a.UID)
			writeJSON(w, http.StatusInternalServerError, errorResponse{
				Error:  fmt.Sprintf("admission undone: %v", err),
				Reason: reasonInternal,
			})
			return
		}
	}
	if !known {
		log.Info("Admitted pod", "podUID", a.UID, "devices", deviceSummary(a.Containers))
	}
	writeJSON(w, http.StatusOK, toAdmissionResponse(*a))
}

func (s *controlServer) release(w http.ResponseWriter, r *http.Request) {
	uid := r.PathValue("uid")
	a, ok := s.admitter.Pod(types.UID(uid))
	if !ok || !s.admitter.Release(types.UID(uid)) {
		writeJSON(w, http.StatusNotFound, podNotFound(uid))
		return
	}
	log := s.log.WithValues("pod", klog.KRef(a.Namespace, a.Name), "podUID", uid)
	if s.record != nil {
		if err := s.record(); err != nil {
			log.Error(err, "Released pod, but cannot save the admitted pods")
			writeJSON(w, http.StatusInternalServerError, errorResponse{
				Error:  fmt.Sprintf("pod %s released, but it comes back after a restart: %v", uid, err),
				Reason: reasonInternal,
			})
			return
		}
	}
	log.Info("Released pod")
	writeJSON(w, http.StatusOK, releaseResponse{Pod: podRefJSON{UID: string(a.UID), Name: a.Name, Namespace: a.Namespace}})
}

func podNotFound(uid string) errorResponse {
	return errorResponse{Error: fmt.Sprintf("pod %q is not admitted", uid), Reason: reasonNotFound}
}

// decodePod reads a Pod written as JSON or YAML. Unknown and duplicate
// fields are refused, so that a misspelt "resources" does not silently admit
// a pod without devices.
func decodePod(r io.Reader) (*v1.Pod, error) {
	body, err := io.ReadAll(r)
	if err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			return nil, fmt.Errorf("the pod is larger than %d bytes", mbe.Limit)
		}
		return nil, fmt.Errorf("read the pod: %w", err)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, errors.New("no pod: the request body is empty; send a Pod as JSON or YAML")
	}
	pod := &v1.Pod{}
	if err := yaml.UnmarshalStrict(body, pod); err != nil {
		return nil, fmt.Errorf("not a Pod in JSON or YAML: %w", err)
	}
	if pod.Kind != "" && pod.Kind != "Pod" {
		return nil, fmt.Errorf("kind is %q, want Pod", pod.Kind)
	}
	if pod.APIVersion != "" && pod.APIVersion != "v1" {
		return nil, fmt.Errorf("apiVersion is %q, want v1", pod.APIVersion)
	}
	if err := wholeDeviceCounts(pod); err != nil {
		return nil, err
	}
	return pod, nil
}

// wholeDeviceCounts refuses a fractional limit of an extended resource
// (domain/name), as the API server does: the manager would round it up.
func wholeDeviceCounts(pod *v1.Pod) error {
	for _, c := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
		for _, name := range sortedKeys(c.Resources.Limits) {
			q := c.Resources.Limits[v1.ResourceName(name)]
			if strings.Contains(name, "/") && q.MilliValue()%1000 != 0 {
				return fmt.Errorf("%w: container %q: the limit of %s must be a whole number, not %s",
					podadmit.ErrInvalidPod, c.Name, name, q.String())
			}
		}
	}
	return nil
}

// sameRequests reports whether two pods ask the same of the device manager:
// the same init and app containers, in order, with the same limits and
// restart policies.
func sameRequests(a, b *v1.Pod) bool {
	same := func(x, y []v1.Container) bool {
		return slices.EqualFunc(x, y, func(p, q v1.Container) bool {
			return p.Name == q.Name && sameLimits(p.Resources.Limits, q.Resources.Limits) &&
				(p.RestartPolicy == nil) == (q.RestartPolicy == nil) &&
				(p.RestartPolicy == nil || *p.RestartPolicy == *q.RestartPolicy)
		})
	}
	return same(a.Spec.InitContainers, b.Spec.InitContainers) && same(a.Spec.Containers, b.Spec.Containers)
}

func sameLimits(a, b v1.ResourceList) bool {
	if len(a) != len(b) {
		return false
	}
	for name, q := range a {
		if o, ok := b[name]; !ok || q.Cmp(o) != 0 {
			return false
		}
	}
	return true
}

// admissionError returns the status code and answer of a failed admission.
// The message is the manager's own (the kubelet's wording); the container
// whose admission failed is named apart.
func admissionError(err error) (int, errorResponse) {
	resp := errorResponse{Error: err.Error()}
	if ae := (*podadmit.AdmitError)(nil); errors.As(err, &ae) {
		resp.Container = ae.Container
		resp.Error = ae.Err.Error()
	}
	var code int
	switch {
	case errors.Is(err, devicemanager.ErrPluginNotReady):
		// Before the timeouts: a wait for the plugin that the client's
		// going away ended wraps the context's error too.
		code, resp.Reason = http.StatusServiceUnavailable, reasonPluginNotReady
	case errors.Is(err, podadmit.ErrInvalidPod):
		code, resp.Reason = http.StatusUnprocessableEntity, reasonInvalidPod
	case errors.Is(err, devicemanager.ErrRequestChanged):
		code, resp.Reason = http.StatusUnprocessableEntity, reasonRequestChanged
	case errors.Is(err, devicemanager.ErrInsufficientDevices),
		errors.Is(err, devicemanager.ErrNoHealthyDevices),
		errors.Is(err, devicemanager.ErrAllocatedDeviceUnhealthy),
		errors.Is(err, devicemanager.ErrUnregisteredResource):
		code, resp.Reason = http.StatusConflict, reasonDevicesUnavailable
	case errors.Is(err, &policy.AffinityError{}):
		code, resp.Reason = http.StatusConflict, reasonTopologyAffinity
	case errors.Is(err, podadmit.ErrAdmissionInProgress):
		code, resp.Reason = http.StatusConflict, reasonAdmissionInProgress
	case errors.Is(err, devicemanager.ErrPluginCall):
		code, resp.Reason = http.StatusBadGateway, reasonPluginFailed
	case errors.Is(err, devicemanager.ErrEndpointStopped),
		errors.Is(err, devicemanager.ErrUnknownPlugin),
		errors.Is(err, devicemanager.ErrStopped):
		code, resp.Reason = http.StatusServiceUnavailable, reasonPluginUnavailable
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		code, resp.Reason = http.StatusGatewayTimeout, reasonTimeout
	default:
		code, resp.Reason = http.StatusInternalServerError, reasonInternal
	}
	return code, resp
}

// deviceSummary lists, for a log entry, container/resource=ids of every
// container holding devices.
func deviceSummary(containers []podadmit.Container) []string {
	out := []string{}
	for _, c := range containers {
		for _, res := range sortedKeys(c.Devices) {
			out = append(out, fmt.Sprintf("%s/%s=%s", c.Name, res, strings.Join(c.Devices[res], ",")))
		}
	}
	return out
}

func sortedKeys[K ~string, V any](m map[K]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, string(k))
	}
	slices.Sort(keys)
	return keys
}

// writeJSON answers code with v, indented for people reading --json output.
func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	// An error here means the client went away; there is no one to tell.
	_ = enc.Encode(v)
}

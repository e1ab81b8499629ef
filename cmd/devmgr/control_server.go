package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
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

// maxPodBytes bounds a request body: 4 MiB, a little more than the API
// server's 3 MiB for a request and far more than any pod.
const maxPodBytes = 4 << 20

// maxPodContainers bounds the init and app containers of a pod together.
// Neither the API server nor the kubelet sets a number (a pod stored in
// etcd can have thousands of small ones); real pods have a few, seldom
// dozens. Each container costs an admission an allocation, a checkpoint
// entry and a line of the pods file, so a number far above any real pod
// still keeps one request's work bounded.
const maxPodContainers = 1000

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
	if r.ContentLength > maxPodBytes {
		// Answered before reading: a client that says how much it sends
		// learns at once that it is too much.
		writeJSON(w, http.StatusRequestEntityTooLarge, tooLarge().response())
		return
	}
	pod, err := decodePod(http.MaxBytesReader(w, r.Body, maxPodBytes))
	if be := (*bodyError)(nil); errors.As(err, &be) {
		writeJSON(w, be.code, be.response())
		return
	}
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
	log := podLogger(s.log, pod.Namespace, pod.Name, pod.UID)
	a, err := s.admitter.Admit(r.Context(), pod)
	if err != nil {
		code, resp := admissionError(err)
		if resp.Container != "" {
			log = log.WithValues("containerName", resp.Container)
		}
		log.Info("Refused pod", "err", resp.Error)
		if resp.Reason == reasonPluginNotReady {
			w.Header().Set("Retry-After", strconv.Itoa(int(notReadyRetryAfter/time.Second)))
		}
		writeJSON(w, code, resp)
		return
	}
	// The UID may be the one Admit generated.
	log = podLogger(s.log, a.Namespace, a.Name, a.UID)
	if !known && s.record != nil {
		if err := s.record(); err != nil {
			// A pod that would not come back after a restart must not hold
			// devices now.
			s.admitter.Release(a.UID)
			log.Error(err, "Refused pod: cannot save the admitted pods")
			writeJSON(w, http.StatusInternalServerError, errorResponse{
				Error:  fmt.Sprintf("admission undone: %v", err),
				Reason: reasonInternal,
			})
			return
		}
	}
	if !known {
		log.Info("Admitted pod", "devices", deviceSummary(a.Containers))
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
	log := podLogger(s.log, a.Namespace, a.Name, a.UID)
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

// podLogger returns log naming the pod by what it has: a pod sent without a
// name or a UID is not logged as "default/" or with an empty UID.
func podLogger(log klog.Logger, namespace, name string, uid types.UID) klog.Logger {
	if name != "" {
		if namespace == "" {
			namespace = "default" // as Admit defaults it
		}
		log = log.WithValues("pod", klog.KRef(namespace, name))
	}
	if uid != "" {
		log = log.WithValues("podUID", uid)
	}
	return log
}

// bodyError is a request body that is not a pod at all: one that does not
// decode (400) or is too large (413). A pod that decodes but cannot be
// admitted as written is an ErrInvalidPod instead (422).
type bodyError struct {
	code   int
	reason string
	msg    string
}

func (e *bodyError) Error() string { return e.msg }

func (e *bodyError) response() errorResponse { return errorResponse{Error: e.msg, Reason: e.reason} }

func badRequest(format string, args ...any) *bodyError {
	return &bodyError{code: http.StatusBadRequest, reason: reasonBadRequest, msg: fmt.Sprintf(format, args...)}
}

func tooLarge() *bodyError {
	return &bodyError{
		code:   http.StatusRequestEntityTooLarge,
		reason: reasonRequestEntityTooLarge,
		msg:    fmt.Sprintf("the request body is larger than %d bytes (%d MiB), the most a pod may take", maxPodBytes, maxPodBytes>>20),
	}
}

// decodePod reads a Pod written as JSON or YAML. Unknown and duplicate
// fields are refused, so that a misspelt "resources" does not silently admit
// a pod without devices. Its errors are a *bodyError or wrap
// podadmit.ErrInvalidPod.
func decodePod(r io.Reader) (*v1.Pod, error) {
	body, err := io.ReadAll(r)
	if err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			return nil, tooLarge()
		}
		return nil, badRequest("read the pod: %v", err)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, badRequest("no pod: the request body is empty; send a Pod as JSON or YAML")
	}
	pod := &v1.Pod{}
	if err := yaml.UnmarshalStrict(body, pod); err != nil {
		return nil, badRequest("%s", decodeError(body, err))
	}
	if pod.Kind != "" && pod.Kind != "Pod" {
		return nil, fmt.Errorf("%w: kind is %q, want Pod", podadmit.ErrInvalidPod, pod.Kind)
	}
	if pod.APIVersion != "" && pod.APIVersion != "v1" {
		return nil, fmt.Errorf("%w: apiVersion is %q, want v1", podadmit.ErrInvalidPod, pod.APIVersion)
	}
	if n := len(pod.Spec.InitContainers) + len(pod.Spec.Containers); n > maxPodContainers {
		return nil, fmt.Errorf("%w: the pod has %d containers (init and app together); devmgr admits at most %d",
			podadmit.ErrInvalidPod, n, maxPodContainers)
	}
	if err := wholeDeviceCounts(pod); err != nil {
		return nil, err
	}
	return pod, nil
}

// decodeError says why body, which failed to decode into a Pod with err, is
// not one: it is not JSON or YAML at all, or a field has the wrong type or is
// unknown to a Pod. The decoder's own wording ("error converting YAML to
// JSON", Go type names) speaks of how devmgr reads the body, not of the body.
func decodeError(body []byte, err error) string {
	if _, syntaxErr := yaml.YAMLToJSONStrict(body); syntaxErr != nil {
		return "not JSON or YAML: " + syntaxErr.Error()
	}
	if te := (*json.UnmarshalTypeError)(nil); errors.As(err, &te) && te.Field != "" {
		return fmt.Sprintf("not a Pod: %s is %s, want %s", te.Field, jsonValue(te.Value), jsonKind(te.Type))
	}
	for inner := errors.Unwrap(err); inner != nil; inner = errors.Unwrap(inner) {
		err = inner // the innermost: the JSON decoder's, without the wrappers' prefixes
	}
	return "not a Pod: " + strings.TrimPrefix(err.Error(), "json: ")
}

// jsonValue names a JSON value as json.UnmarshalTypeError's Value does.
func jsonValue(v string) string {
	switch v {
	case "array":
		return "a list"
	case "object":
		return "an object"
	case "bool":
		return "true or false"
	}
	return "a " + v // number, string
}

// jsonKind names the JSON value a field of type t takes.
func jsonKind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
		reflect.Float32, reflect.Float64:
		return "a number"
	}
	return "another type"
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

package main

import (
	"github.com/openkubelet/devmgr/devicemanager"
	"github.com/openkubelet/devmgr/podadmit"
)

// The control API of "devmgr serve": JSON over HTTP on a unix socket.
//
//	GET    /v1/status       statusResponse
//	GET    /v1/pods         podsResponse
//	POST   /v1/pods         admissionResponse (body: a Pod as JSON or YAML)
//	GET    /v1/pods/{uid}   admissionResponse
//	DELETE /v1/pods/{uid}   releaseResponse
//
// Every error answer of these handlers is an errorResponse (Content-Type
// application/json), whatever its status code. The JSON field names are the
// API: fields are only ever added, never renamed or removed. Lists are never
// null and maps never absent, so that clients need no special case for
// "none".

const (
	pathStatus = "/v1/status"
	pathPods   = "/v1/pods"
)

// statusResponse answers GET /v1/status.
type statusResponse struct {
	Resources []resourceJSON `json:"resources"`
	// Endpoints are the plugin instances of every resource, by resource
	// then socket.
	Endpoints []endpointJSON `json:"endpoints"`
	Manager   managerJSON    `json:"manager"`
}

// resourceJSON is one resource. Allocatable counts the healthy devices (as
// the kubelet means it), Free the healthy devices no container holds.
type resourceJSON struct {
	Name        string       `json:"name"`
	Capacity    int          `json:"capacity"`
	Allocatable int          `json:"allocatable"`
	Allocated   int          `json:"allocated"`
	Free        int          `json:"free"`
	Devices     []deviceJSON `json:"devices"`
	// RestoredFromCheckpoint: known from the checkpoint; no plugin has
	// reported devices since the manager started.
	RestoredFromCheckpoint bool `json:"restoredFromCheckpoint"`
}

type deviceJSON struct {
	ID        string  `json:"id"`
	Health    string  `json:"health"`
	NUMA      []int64 `json:"numa"`
	Allocated bool    `json:"allocated"`
}

type endpointJSON struct {
	Resource string              `json:"resource"`
	Socket   string              `json:"socket"`
	Options  endpointOptionsJSON `json:"options"`
	Stopped  bool                `json:"stopped"`
}

type endpointOptionsJSON struct {
	PreStartRequired                bool `json:"preStartRequired"`
	GetPreferredAllocationAvailable bool `json:"getPreferredAllocationAvailable"`
}

// managerJSON describes the serving manager itself.
type managerJSON struct {
	SocketDir     string `json:"socketDir"`
	CheckpointDir string `json:"checkpointDir"`
	NUMANodes     []int  `json:"numaNodes"`
}

// podRefJSON names a pod.
type podRefJSON struct {
	UID       string `json:"uid"`
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
}

// admissionResponse answers POST /v1/pods and GET /v1/pods/{uid}.
type admissionResponse struct {
	Pod        podRefJSON      `json:"pod"`
	Containers []containerJSON `json:"containers"`
}

// containerJSON is what one container holds. RunOptions is always present in
// an admissionResponse (empty lists for a container without devices) and
// absent from a podsResponse.
type containerJSON struct {
	Name       string              `json:"name"`
	Devices    map[string][]string `json:"devices"`
	RunOptions *runOptionsJSON     `json:"runOptions,omitempty"`
}

type runOptionsJSON struct {
	Envs        []nameValueJSON  `json:"envs"`
	Mounts      []mountJSON      `json:"mounts"`
	Devices     []deviceSpecJSON `json:"devices"`
	Annotations []nameValueJSON  `json:"annotations"`
	CDIDevices  []cdiDeviceJSON  `json:"cdiDevices"`
}

type nameValueJSON struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

type mountJSON struct {
	ContainerPath string `json:"containerPath"`
	HostPath      string `json:"hostPath"`
	ReadOnly      bool   `json:"readOnly"`
}

type deviceSpecJSON struct {
	PathOnHost      string `json:"pathOnHost"`
	PathInContainer string `json:"pathInContainer"`
	Permissions     string `json:"permissions"`
}

type cdiDeviceJSON struct {
	Name string `json:"name"`
}

// podsResponse answers GET /v1/pods: the admitted pods in admission order.
type podsResponse struct {
	Pods []podJSON `json:"pods"`
}

type podJSON struct {
	UID        string          `json:"uid"`
	Name       string          `json:"name"`
	Namespace  string          `json:"namespace"`
	Containers []containerJSON `json:"containers"`
}

// releaseResponse answers DELETE /v1/pods/{uid}.
type releaseResponse struct {
	Pod podRefJSON `json:"pod"`
}

// errorResponse is every error answer: {"error": ..., "reason": ...}, and
// "container" when an admission failed on one. Error is for people and
// keeps the device manager's (the kubelet's) wording; Reason, one of the
// reason* constants, is for programs.
type errorResponse struct {
	Error     string `json:"error"`
	Container string `json:"container,omitempty"`
	Reason    string `json:"reason"`
}

// Reasons of errorResponse.
const (
	reasonBadRequest            = "BadRequest"            // 400: the body does not decode into a Pod (not JSON or YAML, a field unknown or of the wrong type)
	reasonRequestEntityTooLarge = "RequestEntityTooLarge" // 413: the body is over maxPodBytes
	reasonInvalidPod            = "InvalidPod"            // 422: a Pod devmgr cannot admit as written (another kind, no containers, too many, a fractional device count)
	reasonRequestChanged        = "RequestChanged"        // 422: an admitted UID with other device requests
	reasonDevicesUnavailable    = "DevicesUnavailable"    // 409: not enough healthy free devices, or none registered
	reasonAdmissionInProgress   = "AdmissionInProgress"   // 409: the same pod is being admitted
	reasonTopologyAffinity      = "TopologyAffinityError" // 409: the topology policy refused the container (the kubelet's reason)
	reasonPluginFailed          = "PluginFailed"          // 502: a plugin call failed
	reasonPluginUnavailable     = "PluginUnavailable"     // 503: the resource's plugin is gone
	reasonPluginNotReady        = "PluginNotReady"        // 503 with Retry-After: the resource's plugin is not back yet; retry
	reasonTimeout               = "Timeout"               // 504
	reasonNotFound              = "NotFound"              // 404
	reasonMethodNotAllowed      = "MethodNotAllowed"      // 405
	reasonInternal              = "Internal"              // 500
)

func toStatusResponse(resources []devicemanager.ResourceStatus, mgr managerJSON) statusResponse {
	out := statusResponse{Resources: []resourceJSON{}, Endpoints: []endpointJSON{}, Manager: mgr}
	if out.Manager.NUMANodes == nil {
		out.Manager.NUMANodes = []int{}
	}
	for _, r := range resources {
		rj := resourceJSON{
			Name:                   r.Name,
			Capacity:               r.Capacity,
			Allocatable:            r.Allocatable,
			Allocated:              r.Allocated,
			Free:                   r.Free,
			Devices:                make([]deviceJSON, 0, len(r.Devices)),
			RestoredFromCheckpoint: r.RestoredFromCheckpoint,
		}
		for _, d := range r.Devices {
			numa := d.NUMANodes
			if numa == nil {
				numa = []int64{}
			}
			rj.Devices = append(rj.Devices, deviceJSON{ID: d.ID, Health: d.Health, NUMA: numa, Allocated: d.Allocated})
		}
		out.Resources = append(out.Resources, rj)
		for _, e := range r.Endpoints {
			out.Endpoints = append(out.Endpoints, endpointJSON{
				Resource: e.Resource,
				Socket:   e.Socket,
				Options: endpointOptionsJSON{
					PreStartRequired:                e.PreStartRequired,
					GetPreferredAllocationAvailable: e.GetPreferredAllocationAvailable,
				},
				Stopped: e.Stopped,
			})
		}
	}
	return out
}

func toAdmissionResponse(a podadmit.Admission) admissionResponse {
	out := admissionResponse{
		Pod:        podRefJSON{UID: string(a.UID), Name: a.Name, Namespace: a.Namespace},
		Containers: make([]containerJSON, 0, len(a.Containers)),
	}
	for _, c := range a.Containers {
		cj := toContainerJSON(c)
		cj.RunOptions = toRunOptionsJSON(c.RunOptions)
		out.Containers = append(out.Containers, cj)
	}
	return out
}

func toPodsResponse(pods []podadmit.Admission) podsResponse {
	out := podsResponse{Pods: make([]podJSON, 0, len(pods))}
	for _, a := range pods {
		pj := podJSON{UID: string(a.UID), Name: a.Name, Namespace: a.Namespace, Containers: make([]containerJSON, 0, len(a.Containers))}
		for _, c := range a.Containers {
			pj.Containers = append(pj.Containers, toContainerJSON(c))
		}
		out.Pods = append(out.Pods, pj)
	}
	return out
}

func toContainerJSON(c podadmit.Container) containerJSON {
	devs := make(map[string][]string, len(c.Devices))
	for res, ids := range c.Devices {
		if ids == nil {
			ids = []string{}
		}
		devs[res] = ids
	}
	return containerJSON{Name: c.Name, Devices: devs}
}

func toRunOptionsJSON(o *devicemanager.DeviceRunContainerOptions) *runOptionsJSON {
	out := &runOptionsJSON{
		Envs:        []nameValueJSON{},
		Mounts:      []mountJSON{},
		Devices:     []deviceSpecJSON{},
		Annotations: []nameValueJSON{},
		CDIDevices:  []cdiDeviceJSON{},
	}
	if o == nil {
		return out
	}
	for _, e := range o.Envs {
		out.Envs = append(out.Envs, nameValueJSON{Name: e.Name, Value: e.Value})
	}
	for _, m := range o.Mounts {
		out.Mounts = append(out.Mounts, mountJSON{ContainerPath: m.ContainerPath, HostPath: m.HostPath, ReadOnly: m.ReadOnly})
	}
	for _, d := range o.Devices {
		out.Devices = append(out.Devices, deviceSpecJSON{PathOnHost: d.PathOnHost, PathInContainer: d.PathInContainer, Permissions: d.Permissions})
	}
	for _, a := range o.Annotations {
		out.Annotations = append(out.Annotations, nameValueJSON{Name: a.Name, Value: a.Value})
	}
	for _, c := range o.CDIDevices {
		out.CDIDevices = append(out.CDIDevices, cdiDeviceJSON{Name: c.Name})
	}
	return out
}

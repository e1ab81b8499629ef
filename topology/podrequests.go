package topology

import v1 "k8s.io/api/core/v1"

// PodRequests returns what a pod needs of each resource over its life, from
// container limits (Quantity.Value, rounded up), by the sidecar formula of
// the kubelet's pod-scope hints: the larger of
//   - the sum over app containers plus every restartable init container
//     (sidecar), which run together, and
//   - for each init container, its own limit plus the limits of the
//     sidecars started before it (for a sidecar, the running sum including
//     itself).
//
// Every resource named in a limit is present, including cpu and memory;
// callers keep the device-plugin resources. Pod-level resources and overhead
// are not counted: they do not apply to extended resources. A nil pod gives
// an empty map.
func PodRequests(pod *v1.Pod) map[string]int64 {
	total := make(map[string]int64)
	if pod == nil {
		return total
	}
	for i := range pod.Spec.Containers {
		for name, q := range pod.Spec.Containers[i].Resources.Limits {
			total[string(name)] += q.Value()
		}
	}

	sidecars := make(map[string]int64) // running sum over sidecars so far
	initPeak := make(map[string]int64)
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		restartable := c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways
		own := make(map[string]int64, len(c.Resources.Limits))
		for name, q := range c.Resources.Limits {
			if restartable {
				sidecars[string(name)] += q.Value()
			} else {
				own[string(name)] = q.Value()
			}
		}
		// While this container starts, the sidecars before it (and, for a
		// sidecar, itself) run too.
		for name, v := range sidecars {
			own[name] += v
		}
		raise(initPeak, own)
	}
	for name, v := range sidecars {
		total[name] += v
	}
	raise(total, initPeak)
	return total
}

// raise sets dst[k] to max(dst[k], v) for every k, v of src, adding missing keys.
func raise(dst, src map[string]int64) {
	for name, v := range src {
		if cur, ok := dst[name]; !ok || v > cur {
			dst[name] = v
		}
	}
}

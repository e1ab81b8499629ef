package devicemanager

// The structured-logging vocabulary of the manager: every key used in a log
// call is one of these.
const (
	keyResource  = "resourceName"
	keyPodUID    = "podUID"
	keyPod       = "pod"
	keyContainer = "containerName"
	keyDeviceIDs = "deviceIDs"
	keySocket    = "socketPath"
	keyCount     = "count"
	keyPath      = "path"
	keyHealthy   = "healthy"
	keyUnhealthy = "unhealthy"
	keyConflict  = "conflict"
	keyRemoved   = "removed"
	keyVersion   = "version"
	keyDuration  = "duration"
	keyLabel     = "label"
)

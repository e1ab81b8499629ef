// Package podinfo names the pod a device plugin call is for. Allocate,
// PreStartContainer and GetPreferredAllocation carry device IDs only, so a
// plugin cannot tell which pod it is preparing devices for (the kubelet
// declined to add it: kubernetes#63048). A device manager with
// devicemanager.Options.SendPodInfo set sends the pod's namespace, name and
// UID and the container's name as gRPC metadata on those calls; a plugin
// reads them with FromIncomingContext.
//
// On the wire, each field is one metadata entry under the keys below, its
// value percent-encoded (RFC 3986, as Go's url.PathEscape does: a valid
// Kubernetes name is sent as it is). A plugin in another language reads the
// same keys from the call's metadata and decodes the values. A call without
// the entries comes from a kubelet, or from a manager that does not send
// them.
package podinfo

import (
	"context"
	"net/url"

	"google.golang.org/grpc/metadata"
)

// The metadata keys, one per field of Info.
const (
	KeyKind      = "devmgr-kind"
	KeyNamespace = "devmgr-namespace"
	KeyName      = "devmgr-name"
	KeyUID       = "devmgr-uid"
	KeyContainer = "devmgr-container"
)

// The kinds of object a call serves.
const (
	// KindPod: a container of a pod.
	KindPod = "Pod"
	// KindResourceClaim: a request of a DRA ResourceClaim (package dra);
	// Container is the request's name.
	KindResourceClaim = "ResourceClaim"
)

// Info is what a call says of the object it serves.
type Info struct {
	// Kind is KindPod or KindResourceClaim.
	Kind string
	// Namespace, Name and UID are the pod's or the claim's.
	Namespace, Name, UID string
	// Container is the container's name, or the claim's request.
	Container string
}

func (i Info) pairs() [][2]string {
	return [][2]string{
		{KeyKind, i.Kind}, {KeyNamespace, i.Namespace}, {KeyName, i.Name}, {KeyUID, i.UID}, {KeyContainer, i.Container},
	}
}

// NewOutgoingContext returns ctx with info as the metadata of the calls made
// with it, replacing any Info that ctx carries already and keeping other
// metadata.
func NewOutgoingContext(ctx context.Context, info Info) context.Context {
	md, _ := metadata.FromOutgoingContext(ctx)
	md = md.Copy()
	for _, kv := range info.pairs() {
		md.Set(kv[0], url.PathEscape(kv[1]))
	}
	return metadata.NewOutgoingContext(ctx, md)
}

// FromIncomingContext returns the Info of the call a server handles; ok is
// false when the caller sent none.
func FromIncomingContext(ctx context.Context) (info Info, ok bool) {
	md, _ := metadata.FromIncomingContext(ctx)
	return FromMetadata(md)
}

// FromMetadata returns the Info that md holds; ok is false when md holds
// none. A value that does not decode is returned as it was sent.
func FromMetadata(md metadata.MD) (info Info, ok bool) {
	fields := []*string{&info.Kind, &info.Namespace, &info.Name, &info.UID, &info.Container}
	for i, kv := range info.pairs() {
		vs := md.Get(kv[0])
		if len(vs) == 0 {
			continue
		}
		ok = true
		*fields[i] = vs[0]
		if v, err := url.PathUnescape(vs[0]); err == nil {
			*fields[i] = v
		}
	}
	return info, ok
}

package podinfo_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/metadata"

	"github.com/openkubelet/devmgr/podinfo"
)

// incoming hands the outgoing metadata of ctx to a server's context, as a
// gRPC call does.
func incoming(ctx context.Context) context.Context {
	md, _ := metadata.FromOutgoingContext(ctx)
	return metadata.NewIncomingContext(context.Background(), md)
}

func TestInfoTravelsFromCallerToServer(t *testing.T) {
	info := podinfo.Info{Kind: podinfo.KindPod, Namespace: "ml", Name: "train-0", UID: "0f1e2d3c-aaaa-4bbb-8ccc-123456789abc", Container: "main"}
	got, ok := podinfo.FromIncomingContext(incoming(podinfo.NewOutgoingContext(context.Background(), info)))
	require.True(t, ok)
	assert.Equal(t, info, got)
}

func TestValidNamesAreSentAsTheyAre(t *testing.T) {
	ctx := podinfo.NewOutgoingContext(context.Background(), podinfo.Info{Kind: podinfo.KindPod, Namespace: "kube-system", Name: "gpu-job.a-1", UID: "u-1", Container: "c"})
	md, _ := metadata.FromOutgoingContext(ctx)
	assert.Equal(t, []string{"kube-system"}, md.Get(podinfo.KeyNamespace))
	assert.Equal(t, []string{"gpu-job.a-1"}, md.Get(podinfo.KeyName))
	assert.Equal(t, []string{"u-1"}, md.Get(podinfo.KeyUID))
	assert.Equal(t, []string{"c"}, md.Get(podinfo.KeyContainer))
	assert.Equal(t, []string{"Pod"}, md.Get(podinfo.KeyKind))
}

// gRPC refuses metadata values outside printable ASCII: such values are
// percent-encoded, and decoded on the other side.
func TestValuesOutsidePrintableASCIIAreEncoded(t *testing.T) {
	info := podinfo.Info{Kind: podinfo.KindPod, Namespace: "ns", Name: "pod ü\n", UID: "100%", Container: "c/1"}
	ctx := podinfo.NewOutgoingContext(context.Background(), info)
	md, _ := metadata.FromOutgoingContext(ctx)
	for _, k := range []string{podinfo.KeyName, podinfo.KeyUID, podinfo.KeyContainer} {
		for _, c := range md.Get(k)[0] {
			assert.True(t, c >= 0x20 && c < 0x7f && c != ' ', "key %s: value %q holds %q", k, md.Get(k)[0], c)
		}
	}
	got, ok := podinfo.FromIncomingContext(incoming(ctx))
	require.True(t, ok)
	assert.Equal(t, info, got)
}

func TestANewInfoReplacesTheOldAndKeepsOtherMetadata(t *testing.T) {
	ctx := metadata.AppendToOutgoingContext(context.Background(), "trace-id", "t1")
	ctx = podinfo.NewOutgoingContext(ctx, podinfo.Info{Kind: podinfo.KindPod, Namespace: "a", Name: "a", UID: "a", Container: "a"})
	ctx = podinfo.NewOutgoingContext(ctx, podinfo.Info{Kind: podinfo.KindPod, Namespace: "b", Name: "b", UID: "b", Container: "b"})
	md, _ := metadata.FromOutgoingContext(ctx)
	assert.Equal(t, []string{"b"}, md.Get(podinfo.KeyName), "one value per key")
	assert.Equal(t, []string{"t1"}, md.Get("trace-id"))
}

func TestACallWithoutInfoSaysSo(t *testing.T) {
	_, ok := podinfo.FromIncomingContext(context.Background())
	assert.False(t, ok)
	_, ok = podinfo.FromMetadata(metadata.Pairs("trace-id", "t1"))
	assert.False(t, ok)
	got, ok := podinfo.FromMetadata(metadata.Pairs(podinfo.KeyUID, "u", podinfo.KeyName, "bad%zz"))
	assert.True(t, ok)
	assert.Equal(t, podinfo.Info{UID: "u", Name: "bad%zz"}, got, "a value that does not decode is returned as sent")
}

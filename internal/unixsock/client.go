package unixsock

import (
	"context"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// NewClient returns a gRPC client of the unix socket at path, without
// transport security. The target is a fixed authority that the dialer
// ignores, so any path (spaces, '%', '=') reaches the socket unchanged. opts
// apply after the socket's dialer: a grpc.WithContextDialer among them
// replaces it.
func NewClient(path string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	return grpc.NewClient("passthrough:///localhost", append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}),
	}, opts...)...)
}

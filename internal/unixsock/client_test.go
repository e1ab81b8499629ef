package unixsock_test

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/openkubelet/devmgr/internal/unixsock"
)

// serveHealth serves the gRPC health service on a socket at path.
func serveHealth(t *testing.T, path string) {
	t.Helper()
	lis, err := unixsock.Listen(path, 0o600)
	require.NoError(t, err)
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
}

func check(t *testing.T, conn *grpc.ClientConn) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

// Names a URL would mangle reach the socket as they are.
func TestNewClientReachesAnySocketPath(t *testing.T) {
	path := filepath.Join(shortDir(t), "a b%20=c.sock")
	serveHealth(t, path)
	conn, err := unixsock.NewClient(path)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, check(t, conn))
}

// A dialer among the options replaces the socket's.
func TestNewClientTakesTheCallersDialer(t *testing.T) {
	dir := shortDir(t)
	real := filepath.Join(dir, "real.sock")
	serveHealth(t, real)
	conn, err := unixsock.NewClient(filepath.Join(dir, "missing.sock"),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", real)
		}))
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, check(t, conn))
}

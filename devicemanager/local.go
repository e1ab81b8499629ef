package devicemanager

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/test/bufconn"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openkubelet/devmgr/internal/pluginreg"
)

// localPrefix starts the instance name of a resource registered with
// RegisterLocal, where a plugin's instance has its socket path. Socket paths
// are absolute, so the two never meet.
const localPrefix = "local:"

// localBufferSize is the size of each direction's buffer of the in-memory
// connection to a local device source.
const localBufferSize = 256 << 10

// RegisterLocal registers resourceName as served by server, a device plugin
// written in Go inside the embedding program, as a plugin registering on
// kubelet.sock would be: the manager serves server on an in-memory
// connection, dials it, follows its ListAndWatch stream and calls its
// Allocate, PreStartContainer and GetPreferredAllocation. Capacity, health,
// Updates, the checkpoint, podresources and Status treat the resource as any
// other; its instance is named "local:<resourceName>" in Status and logs.
// No socket is created.
//
// opts, when not nil, is what the manager uses as the plugin's options;
// nil: the manager asks server's GetDevicePluginOptions. Every method of
// server must return when its context ends, as a plugin's must: stop and
// Stop wait for the calls in progress.
//
// RegisterLocal refuses an invalid resource name (as Register does), a call
// before Start or after Stop (ErrStopped), a resource already registered
// locally or being registered by a concurrent call, and a resource over
// MaxResources or MaxInstancesPerResource (ErrPluginLimit). Once it returns,
// the resource's first device list may still be on its way, as after a
// plugin's registration.
//
// stop disconnects the resource as a plugin that goes away: its devices are
// unhealthy at once, and GetCapacity removes the resource after
// StopGracePeriod unless it registers again; allocations stay. stop returns
// once server has no call running and will get none, so it must not be
// called from inside server's methods; it is idempotent.
// Stop does the same for every local resource still registered.
func (m *ManagerImpl) RegisterLocal(resourceName string, server pluginapi.DevicePluginServer,
	opts *pluginapi.DevicePluginOptions) (stop func(), err error) {
	if err := pluginreg.CheckResourceName(resourceName); err != nil {
		return nil, err
	}
	if server == nil {
		return nil, errors.New("RegisterLocal: nil device plugin server")
	}
	name := localPrefix + resourceName
	lis := bufconn.Listen(localBufferSize)
	srv := grpc.NewServer(grpc.WaitForHandlers(true), grpc.MaxRecvMsgSize(m.opts.MaxRecvMsgSize))
	if opts != nil {
		server = fixedOptions{DevicePluginServer: server, opts: opts}
	}
	pluginapi.RegisterDevicePluginServer(srv, server)

	// The server runs until stop or Stop; both goroutines count in m.wg,
	// added under m.mu while the manager runs, so that Stop waits for them.
	ctx, cancel := context.WithCancel(m.ctx)
	m.mu.Lock()
	switch {
	case m.state != started:
		m.mu.Unlock()
		cancel()
		return nil, fmt.Errorf("register local resource %q: the device manager is not running: %w", resourceName, ErrStopped)
	case m.connectingLocal.Has(resourceName) ||
		m.core.resources[resourceName] != nil && m.core.resources[resourceName].instances[name] != nil:
		m.mu.Unlock()
		cancel()
		return nil, fmt.Errorf("register local resource %q: already registered locally", resourceName)
	}
	m.connectingLocal.Insert(resourceName)
	m.wg.Add(2)
	m.mu.Unlock()
	go func() {
		defer m.wg.Done()
		_ = srv.Serve(lis)
	}()
	go func() {
		defer m.wg.Done()
		<-ctx.Done()
		srv.Stop()
	}()

	eopts := m.opts.endpointOptions()
	eopts.Dialer = lis.DialContext
	ep, err := m.connectWith(m.ctx, resourceName, name, eopts)
	m.mu.Lock()
	m.connectingLocal.Delete(resourceName)
	m.mu.Unlock()
	if err != nil {
		cancel()
		srv.Stop()
		return nil, fmt.Errorf("register local resource %q: %w", resourceName, err)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			m.disconnect(resourceName, ep)
			cancel()
			srv.Stop()
		})
	}, nil
}

// fixedOptions is a device plugin server whose options are given.
type fixedOptions struct {
	pluginapi.DevicePluginServer
	opts *pluginapi.DevicePluginOptions
}

func (f fixedOptions) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return f.opts, nil
}

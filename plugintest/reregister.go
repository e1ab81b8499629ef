package plugintest

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/fsnotify/fsnotify"
)

// Re-registration (unless Options.NoReregister): once Register has succeeded, a
// Plugin follows the kubelet socket it registered on, as real device plugins
// do. A kubelet that starts
// removes every socket in its directory and then creates kubelet.sock; each
// time that socket is created anew, the Plugin serves its own socket again if
// it is gone and registers again.
//
// One fsnotify watcher serves every Plugin of the process (kubeletWatch): a
// watcher costs an inotify instance, and a user has 128 of them by default,
// shared by every process, which a package's tests with many Plugins alive at
// once would exhaust.

// follow makes p re-register on kubeletSocket (an absolute path) whenever it
// is created anew, from now on. A no-op with Options.NoReregister or once p
// has stopped.
func (p *Plugin) follow(kubeletSocket string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.reregisters || p.stopped || p.following == kubeletSocket {
		return nil
	}
	// Under p.mu, so that Stop, which unsubscribes after it has set stopped,
	// cannot miss a subscription.
	if err := watchHub.subscribe(p, kubeletSocket); err != nil {
		return fmt.Errorf("plugintest: registered, but cannot watch %s to register again when it is re-created: %w", kubeletSocket, err)
	}
	if p.following != "" {
		watchHub.unsubscribe(p, p.following)
	} else {
		p.wg.Add(1)
		go p.reregisterLoop()
	}
	p.following = kubeletSocket
	return nil
}

// reregisterLoop registers p again each time the kubelet socket it follows
// is created, until p stops.
func (p *Plugin) reregisterLoop() {
	defer p.wg.Done()
	for {
		select {
		case <-p.done:
			return
		case <-p.kubeletCreated:
		}
		p.mu.Lock()
		kubeletSocket := p.following
		p.mu.Unlock()
		switch err := p.reregister(kubeletSocket); {
		case err == nil, errors.Is(err, ErrStopped):
		case errors.Is(err, errSuperseded):
			p.logger.V(2).Info("Not registering again", "reason", err.Error())
		default:
			p.logger.Error(err, "Cannot register again", "socketPath", kubeletSocket)
		}
	}
}

// reregister serves p's socket again if it is gone and registers on
// kubeletSocket. Stop cancels it.
func (p *Plugin) reregister(kubeletSocket string) error {
	p.logger.V(2).Info("Kubelet socket created anew, registering again", "socketPath", kubeletSocket)
	if err := p.serveAgain(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(p.stopCtx, RegisterTimeout)
	defer cancel()
	err := p.RegisterWith(ctx, kubeletSocket, p.RegisterRequest())
	if err != nil && p.stopCtx.Err() != nil {
		return ErrStopped
	}
	return err
}

// errSuperseded is why a Plugin does not register again: another serves its
// socket path.
var errSuperseded = errors.New("another plugin serves the socket now")

// serveAgain listens on SocketPath again when the socket there is gone,
// replacing the listener whose file was removed; the connections already
// open stay. It leaves the socket alone, and fails, when another Plugin of
// the process started on the same path later (a simulated restart) or
// something else is at the path.
func (p *Plugin) serveAgain() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return ErrStopped
	}
	if latestOnPath(p.socketPath) != p {
		return fmt.Errorf("plugintest: %s: %w (a new Plugin on the same path)", p.socketPath, errSuperseded)
	}
	fi, err := os.Lstat(p.socketPath)
	switch {
	case err == nil && os.SameFile(fi, p.socket.info):
		return nil // still served
	case err == nil:
		return fmt.Errorf("plugintest: %s: %w", p.socketPath, errSuperseded)
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("plugintest: %w", err)
	}
	lis, sock, err := listenUnix(p.socketPath)
	if err != nil {
		return err
	}
	// Its Serve goroutine returns once the listener is closed.
	_ = p.listener.Close()
	p.listener, p.socket = lis, sock
	p.serveLocked(p.server, lis)
	p.logger.V(2).Info("Device plugin serving again", "socketPath", p.socketPath)
	return nil
}

// latest maps a socket path to the Plugin that started on it last, so that
// an older Plugin on the same path, a simulated restart still running, never
// takes the socket back.
var latest = struct {
	mu      sync.Mutex
	plugins map[string]*Plugin
}{plugins: make(map[string]*Plugin)}

func setLatestOnPath(path string, p *Plugin) {
	latest.mu.Lock()
	defer latest.mu.Unlock()
	latest.plugins[path] = p
}

// forgetOnPath forgets p, if it is still the latest on path.
func forgetOnPath(path string, p *Plugin) {
	latest.mu.Lock()
	defer latest.mu.Unlock()
	if latest.plugins[path] == p {
		delete(latest.plugins, path)
	}
}

func latestOnPath(path string) *Plugin {
	latest.mu.Lock()
	defer latest.mu.Unlock()
	return latest.plugins[path]
}

// kubeletWatch is the fsnotify watcher shared by every following Plugin. It
// runs while one Plugin, at least, follows a kubelet socket: the last to
// unsubscribe closes it and waits for its goroutine.
type kubeletWatch struct {
	mu      sync.Mutex
	w       *fsnotify.Watcher
	done    chan struct{}                   // closed when the goroutine of w ends
	sockets map[string]map[*Plugin]struct{} // kubelet socket → Plugins following it
	dirs    map[string]int                  // watched directory → sockets in it followed
}

var watchHub = &kubeletWatch{}

// subscribe makes h signal p.kubeletCreated whenever kubeletSocket is
// created.
func (h *kubeletWatch) subscribe(p *Plugin, kubeletSocket string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.w == nil {
		w, err := fsnotify.NewWatcher()
		if err != nil {
			return err
		}
		h.w, h.done = w, make(chan struct{})
		h.sockets, h.dirs = make(map[string]map[*Plugin]struct{}), make(map[string]int)
		go h.run(w, h.done)
	}
	dir := filepath.Dir(kubeletSocket)
	if h.dirs[dir] == 0 {
		if err := h.w.Add(dir); err != nil {
			h.closeIfIdleLocked()
			return err
		}
	}
	if h.sockets[kubeletSocket] == nil {
		h.sockets[kubeletSocket] = make(map[*Plugin]struct{})
	}
	if _, ok := h.sockets[kubeletSocket][p]; !ok {
		h.sockets[kubeletSocket][p] = struct{}{}
		h.dirs[dir]++
	}
	return nil
}

// unsubscribe undoes subscribe; the last subscriber's call returns once the
// watcher's goroutine has ended.
func (h *kubeletWatch) unsubscribe(p *Plugin, kubeletSocket string) {
	h.mu.Lock()
	if _, ok := h.sockets[kubeletSocket][p]; !ok {
		h.mu.Unlock()
		return
	}
	delete(h.sockets[kubeletSocket], p)
	if len(h.sockets[kubeletSocket]) == 0 {
		delete(h.sockets, kubeletSocket)
	}
	dir := filepath.Dir(kubeletSocket)
	if h.dirs[dir]--; h.dirs[dir] == 0 {
		delete(h.dirs, dir)
		_ = h.w.Remove(dir) // fails when the directory is gone, which ended its watch already
	}
	done := h.closeIfIdleLocked()
	h.mu.Unlock()
	if done != nil {
		<-done
	}
}

// closeIfIdleLocked closes the watcher when nobody follows a socket, and
// returns the channel closed when its goroutine ends; nil when it stays.
func (h *kubeletWatch) closeIfIdleLocked() chan struct{} {
	if len(h.dirs) > 0 || h.w == nil {
		return nil
	}
	_ = h.w.Close()
	done := h.done
	h.w, h.done, h.sockets, h.dirs = nil, nil, nil, nil
	return done
}

// run passes the creations of followed sockets on until w is closed.
func (h *kubeletWatch) run(w *fsnotify.Watcher, done chan struct{}) {
	defer close(done)
	for {
		select {
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			if ev.Has(fsnotify.Create) {
				h.created(filepath.Clean(ev.Name))
			}
		case _, ok := <-w.Errors:
			// An overflow (events lost) cannot say which socket was
			// created; the Plugins miss that restart, as real plugins do.
			if !ok {
				return
			}
		}
	}
}

func (h *kubeletWatch) created(path string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for p := range h.sockets[path] {
		notify(p.kubeletCreated)
	}
}

// Package endpoint is one connection from the device manager to one device
// plugin instance: the plugin's gRPC DevicePlugin service on a unix socket.
//
// Dial connects with a deadline and fetches the plugin's options; a failed dial
// closes whatever it opened. Run follows the plugin's ListAndWatch stream and
// hands every message to a callback until the stream ends or its context is
// cancelled. Allocate, PreStartContainer and GetPreferredAllocation each run
// under a deadline from Options, so a plugin that hangs stalls only the caller
// waiting on it. NewStopped makes the placeholder endpoint the manager keeps for
// a resource restored from a checkpoint whose plugin has not come back.
//
// # Concurrency
//
// Every method of Endpoint is safe for concurrent use. RPCs never hold the
// endpoint's lock.
//
// # Lifecycle
//
// Dial → Run (in a goroutine owned by the caller) → Stop. Stop records the stop
// time on the injected clock, cancels the stream and closes the connection; it
// is idempotent. Run returns once its stream has ended, and a stopped endpoint
// refuses further calls with ErrStopped. An endpoint is never re-dialled: a
// plugin whose stream ended registers again and gets a new endpoint.
package endpoint

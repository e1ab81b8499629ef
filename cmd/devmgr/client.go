package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
)

// envControlSocket names the environment variable that gives the client
// commands their control socket when --control-socket is absent.
const envControlSocket = "DEVMGR_CONTROL_SOCKET"

// clientOptions are the flags every client command shares.
type clientOptions struct {
	controlSocket string
	json          bool
	timeout       time.Duration
	log           klog.Logger // -v 4: each call to serve
}

func (o *clientOptions) addFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&o.controlSocket, "control-socket", "", `the control socket of a running "devmgr serve" (default: $`+envControlSocket+`)`)
	f.BoolVar(&o.json, "json", false, "print the server's JSON answer as is")
	f.DurationVar(&o.timeout, "timeout", time.Minute, "give up waiting for the server after this long")
	cmd.PreRunE = func(cmd *cobra.Command, _ []string) error {
		if !cmd.Flags().Changed("control-socket") {
			o.controlSocket = os.Getenv(envControlSocket)
		}
		if o.controlSocket == "" {
			return &exitError{code: exitUsage, err: errors.New("no control socket: set --control-socket or $" + envControlSocket)}
		}
		var err error
		o.log, err = newLogger("text", logVerbosity(cmd, 0), cmd.ErrOrStderr())
		return err
	}
}

func newStatusCmd() *cobra.Command {
	o := &clientOptions{}
	var waitFor []string
	cmd := &cobra.Command{
		Use:   "status [--control-socket PATH]",
		Short: `Show the resources, devices and plugins of a running "devmgr serve"`,
		Long: `status shows every resource a device plugin registered (or the checkpoint
restored): capacity (all devices), allocatable (healthy devices), allocated
and free (healthy devices no container holds), then each device with its
health and NUMA nodes, then each plugin endpoint with its options.

--wait-for RESOURCE first waits, up to --timeout, until serve answers and a
device plugin of RESOURCE has registered and listed its devices: for a
script that starts serve and a plugin in the background and then admits
pods. It exits 4 when they are not there in time.`,
		Example: `  devmgr status --control-socket /tmp/dp-ctl.sock
  devmgr status --control-socket /tmp/dp-ctl.sock --json | jq '.resources[].free'

  # Serve and a plugin started in the background: wait for both.
  devmgr status --control-socket /tmp/dp-ctl.sock --wait-for example.com/gpu --timeout 30s`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var st statusResponse
			var err error
			if len(waitFor) > 0 {
				err = o.waitForPlugins(cmd, waitFor, &st)
			} else {
				err = o.call(cmd, http.MethodGet, pathStatus, nil, &st)
			}
			if err != nil || o.json {
				return err
			}
			return printStatus(cmd.OutOrStdout(), st)
		},
	}
	o.addFlags(cmd)
	cmd.Flags().StringSliceVar(&waitFor, "wait-for", nil, "first wait, up to --timeout, until serve answers and a device plugin of each of these resources has registered and listed its devices")
	return cmd
}

// waitPoll is how often status --wait-for asks serve again.
const waitPoll = 100 * time.Millisecond

// waitForPlugins asks serve for its status until it answers and every
// resource of names has a plugin registered that listed devices (the answer
// is then handled as call handles it), until an error answer, or until
// --timeout passes.
func (o *clientOptions) waitForPlugins(cmd *cobra.Command, names []string, out *statusResponse) error {
	ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
	defer cancel()
	tick := time.NewTicker(waitPoll)
	defer tick.Stop()
	var missing []string // what the last answer lacked
	var noAnswer error   // why the last call got no answer
	for {
		r, err := o.roundTrip(ctx, http.MethodGet, pathStatus, nil)
		timedOut := ctx.Err() != nil
		switch {
		case err == nil && r.code == http.StatusOK:
			var st statusResponse
			if json.Unmarshal(r.body, &st) != nil {
				return o.answer(cmd, r, out) // which says what is wrong with it
			}
			if missing = withoutPlugin(st, names); len(missing) == 0 {
				return o.answer(cmd, r, out)
			}
			noAnswer = nil
		case err == nil: // an error answer: no use waiting
			return o.answer(cmd, r, out)
		case timedOut && missing != nil:
			// Cut short by --timeout: the last answer says what is missing.
		case timedOut || exitCode(err) == exitNotFound:
			missing, noAnswer = nil, err
		default: // serve may have acted on the request, and did not answer
			return err
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			if missing == nil {
				return &exitError{code: exitNotFound, err: fmt.Errorf("waited %s (--timeout): %w", o.timeout, noAnswer)}
			}
			return &exitError{code: exitNotFound, err: fmt.Errorf("no device plugin of %s registered and listed devices within %s (--timeout)",
				strings.Join(missing, ", "), o.timeout)}
		}
	}
}

// withoutPlugin returns the resources of names that have no running plugin
// endpoint in st, or no devices from it.
func withoutPlugin(st statusResponse, names []string) []string {
	var missing []string
	for _, name := range names {
		listed, running := false, false
		for _, r := range st.Resources {
			listed = listed || r.Name == name && r.Capacity > 0 && !r.RestoredFromCheckpoint
		}
		for _, e := range st.Endpoints {
			running = running || e.Resource == name && !e.Stopped
		}
		if !listed || !running {
			missing = append(missing, name)
		}
	}
	return missing
}

func newPodsCmd() *cobra.Command {
	o := &clientOptions{}
	cmd := &cobra.Command{
		Use:   "pods [--control-socket PATH]",
		Short: `List the pods admitted by a running "devmgr serve" and their devices`,
		Long: `pods lists the admitted pods, in admission order, with the devices each
container holds.`,
		Example: `  devmgr pods --control-socket /tmp/dp-ctl.sock
  devmgr pods --control-socket /tmp/dp-ctl.sock --json | jq -r '.pods[].uid'`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var pods podsResponse
			if err := o.call(cmd, http.MethodGet, pathPods, nil, &pods); err != nil {
				return err
			}
			if o.json {
				return nil
			}
			return printPods(cmd.OutOrStdout(), pods)
		},
	}
	o.addFlags(cmd)
	return cmd
}

func newAdmitCmd() *cobra.Command {
	o := &clientOptions{}
	var file string
	cmd := &cobra.Command{
		Use:   "admit [--control-socket PATH] -f FILE",
		Short: `Admit a pod: allocate devices to its containers, as the kubelet does`,
		Long: `admit sends a Pod (JSON or YAML; "-f -" reads it from standard input) to a
running "devmgr serve", which allocates devices to every init container, then
every app container, in order, calling the plugins' GetPreferredAllocation,
Allocate and PreStartContainer as the kubelet does. It prints the devices and
what the container runtime would get: environment, mounts, device nodes,
annotations and CDI devices.

A pod without metadata.uid gets a generated one, printed here. Admitting an
admitted pod again gives the same answer. When a container cannot get its
devices, the pod holds nothing, the error keeps the kubelet's wording, and
admit exits 3 (1 when a plugin call failed, 5 when a resource's plugin has
not registered again or listed its devices yet: retry later, or start serve
with --plugin-wait).

Extended resources that no plugin registered are ignored, as by the kubelet
(admission succeeds without devices), unless "devmgr serve --require-plugin"
names them.`,
		Example: `  # A pod whose container asks for 2 devices of example.com/gpu:
  cat > pod.yaml <<EOF
  apiVersion: v1
  kind: Pod
  metadata: {name: train, uid: train-1}
  spec:
    containers:
    - name: main
      resources: {limits: {example.com/gpu: 2}}
  EOF
  devmgr admit --control-socket /tmp/dp-ctl.sock -f pod.yaml

  # From standard input, printing the server's JSON:
  devmgr admit --control-socket /tmp/dp-ctl.sock -f - --json < pod.json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			body, err := readPodFile(file, cmd.InOrStdin())
			if err != nil {
				return err
			}
			var a admissionResponse
			if err := o.call(cmd, http.MethodPost, pathPods, body, &a); err != nil {
				return err
			}
			if o.json {
				return nil
			}
			return printAdmission(cmd.OutOrStdout(), a)
		},
	}
	o.addFlags(cmd)
	cmd.Flags().StringVarP(&file, "filename", "f", "", `the pod, as JSON or YAML; "-" reads standard input`)
	if err := cmd.MarkFlagRequired("filename"); err != nil {
		panic(err) // defined above
	}
	return cmd
}

func newReleaseCmd() *cobra.Command {
	o := &clientOptions{}
	cmd := &cobra.Command{
		Use:   "release [--control-socket PATH] UID",
		Short: "Release a pod: free its devices, as when the kubelet removes it",
		Long: `release forgets an admitted pod and frees the devices of its containers.
It exits 4 when no admitted pod has that UID.`,
		Example: `  devmgr release --control-socket /tmp/dp-ctl.sock train-1

  # Release every admitted pod:
  devmgr pods --control-socket /tmp/dp-ctl.sock --json | jq -r '.pods[].uid' |
      xargs -n1 devmgr release --control-socket /tmp/dp-ctl.sock`,
		Args: oneArg("UID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			var rel releaseResponse
			if err := o.call(cmd, http.MethodDelete, pathPods+"/"+url.PathEscape(args[0]), nil, &rel); err != nil {
				return err
			}
			if o.json {
				return nil
			}
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "pod %s/%s released (uid %s)\n", rel.Pod.Namespace, rel.Pod.Name, rel.Pod.UID)
			return err
		},
	}
	o.addFlags(cmd)
	return cmd
}

// readPodFile reads the pod file name, or stdin for "-".
func readPodFile(name string, stdin io.Reader) ([]byte, error) {
	var body []byte
	var err error
	if name == "-" {
		body, err = io.ReadAll(stdin)
		name = "standard input"
	} else {
		body, err = os.ReadFile(name)
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, &exitError{code: exitNotFound, err: fmt.Errorf("read the pod: %w", err)}
	case err != nil:
		return nil, fmt.Errorf("read the pod: %w", err)
	case len(bytes.TrimSpace(body)) == 0:
		return nil, &exitError{code: exitRefused, err: fmt.Errorf("read the pod: %s is empty", name)}
	}
	return body, nil
}

// call sends one request to the control socket and handles its answer (see
// answer).
func (o *clientOptions) call(cmd *cobra.Command, method, path string, body []byte, out any) error {
	ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
	defer cancel()
	r, err := o.roundTrip(ctx, method, path, body)
	if err != nil {
		return err
	}
	return o.answer(cmd, r, out)
}

// reply is an answer of serve.
type reply struct {
	code   int
	status string // such as "404 Not Found"
	body   []byte
}

// roundTrip sends one request to the control socket and returns the
// answer. Without one, the error's exit code is exitNotFound when nothing
// was sent (the dial failed), else exitFailure.
func (o *clientOptions) roundTrip(ctx context.Context, method, path string, body []byte) (reply, error) {
	transport := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", o.controlSocket)
		},
	}
	defer transport.CloseIdleConnections()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	// The host is a placeholder: the transport always dials the socket.
	req, err := http.NewRequestWithContext(ctx, method, "http://devmgr"+path, rd)
	if err != nil {
		return reply{}, err
	}
	start := time.Now()
	o.log.V(4).Info("Calling devmgr serve", "method", method, "path", path, "controlSocket", o.controlSocket)
	resp, err := (&http.Client{Transport: transport}).Do(req)
	if err != nil {
		// Nothing was sent when the dial failed; after it, serve may have
		// acted on the request.
		code := exitFailure
		if oe := (*net.OpError)(nil); errors.As(err, &oe) && oe.Op == "dial" {
			code = exitNotFound
		}
		if errors.Is(err, context.DeadlineExceeded) {
			return reply{}, &exitError{code: code, err: fmt.Errorf("no answer from devmgr serve on %s within %s", o.controlSocket, o.timeout)}
		}
		return reply{}, &exitError{code: code, err: fmt.Errorf("cannot reach devmgr serve on %s (is \"devmgr serve --control-socket %s\" running?): %w",
			o.controlSocket, o.controlSocket, unwrapURLError(err))}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, fmt.Errorf("read the answer of devmgr serve: %w", err)
	}
	o.log.V(4).Info("devmgr serve answered", "status", resp.Status, "bytes", len(raw), "duration", time.Since(start))
	return reply{code: resp.StatusCode, status: resp.Status, body: raw}, nil
}

// answer handles an answer of serve. With --json, it is printed as is, error
// or not. An error answer becomes an error carrying the server's message; a
// success answer is decoded into out.
func (o *clientOptions) answer(cmd *cobra.Command, r reply, out any) error {
	if o.json {
		if _, err := cmd.OutOrStdout().Write(r.body); err != nil {
			return err
		}
	}
	if r.code >= 300 {
		return answerError(r)
	}
	if err := json.Unmarshal(r.body, out); err != nil {
		return fmt.Errorf("devmgr serve answered %s with something other than the expected JSON: %w", r.status, err)
	}
	return nil
}

// answerError turns an error answer into an error: the server's message,
// the container it names, and the HTTP status. Its exit code follows the
// status: a refusal (400, 409, 413, 422: the pod sent, or the devices it
// asks for), not found (404), a plugin not ready (503 with reason
// PluginNotReady), or any other failure.
func answerError(r reply) error {
	var e errorResponse
	decodeErr := json.Unmarshal(r.body, &e)
	code := exitFailure
	switch r.code {
	case http.StatusBadRequest, http.StatusConflict, http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity:
		code = exitRefused
	case http.StatusNotFound:
		code = exitNotFound
	case http.StatusServiceUnavailable:
		if e.Reason == reasonPluginNotReady {
			code = exitNotReady
		}
	}
	if decodeErr != nil || e.Error == "" {
		return &exitError{code: code, err: fmt.Errorf("devmgr serve answered %s: %s", r.status, strings.TrimSpace(string(r.body)))}
	}
	msg := e.Error
	if e.Container != "" {
		msg = fmt.Sprintf("container %q: %s", e.Container, msg)
	}
	return &exitError{code: code, err: fmt.Errorf("%s (%s)", msg, r.status)}
}

// unwrapURLError drops the "Post \"http://devmgr/v1/pods\":" prefix, which
// names a URL the user never typed.
func unwrapURLError(err error) error {
	if ue := (*url.Error)(nil); errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

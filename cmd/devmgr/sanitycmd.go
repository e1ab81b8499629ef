package main

import (
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/openkubelet/devmgr/podinfo"
	"github.com/openkubelet/devmgr/sanity"
)

// sanityOptions are the flags of "devmgr sanity".
type sanityOptions struct {
	socketDir         string
	resource          string
	junit             string
	skip              string
	registerTimeout   time.Duration
	reregisterTimeout time.Duration
	listTimeout       time.Duration
	callTimeout       time.Duration
	preStartTimeout   time.Duration
	parallel          int
	maxDevices        int
	numaNodes         []int
	podInfo           bool
	quiet, asJSON     bool
}

// sanityPod is the pod that --pod-info names in the plugin calls.
var sanityPod = podinfo.Info{
	Kind: podinfo.KindPod, Namespace: "sanity", Name: "sanity-pod",
	UID: "5a71e5a7-0000-4000-8000-000000000001", Container: "sanity",
}

func newSanityCmd() *cobra.Command {
	o := &sanityOptions{}
	cmd := &cobra.Command{
		Use:   "sanity --socket-dir DIR",
		Short: "Check a device plugin the way the kubelet will use it",
		Long: `sanity is a conformance suite for device plugins. It serves kubelet.sock in
DIR, waits for a plugin started separately to register there (the plugin
watches DIR for kubelet.sock, as on a node), and checks its registration,
its ListAndWatch lists, GetPreferredAllocation, Allocate, PreStartContainer,
concurrent Allocate calls, and that it registers again when kubelet.sock is
re-created, as after a kubelet restart. At start and for the restart check
it removes every unix socket in DIR, the plugin's too, as a starting kubelet
does.

As it goes it says on stderr what it waits for and each check as it starts
and ends (--quiet: nothing). At the end it prints one line per check (passed,
failed or skipped, and how long it took), with the messages of each failed
or skipped check under it, and the counts; --json prints the report as one
JSON document instead. --junit FILE also writes the results as JUnit XML, one test
case per check (and one failed "setup" case when no plugin could be
checked). A failure names the rule and what the plugin sent.
list-and-watch/update is always skipped here: it needs a way to make the
plugin send a new list, which only a Go test gives (sanity.Config.TriggerUpdate).

The checks, in the order they run (the names --skip matches):
` + checkList() + `

sanity refuses a DIR whose kubelet.sock accepts connections, so it never
takes over the directory of a running kubelet.

Exit codes: 0 every check that ran passed (skipped ones do not count); 1 a
check failed, or the suite could not run; 2 a bad flag (--skip that is not a
regular expression); 4 no plugin (or none for --resource) registered within
--register-timeout.`,
		Example: `  # Then start your plugin with its kubelet socket at /tmp/dp/kubelet.sock.
  devmgr sanity --socket-dir /tmp/dp

  # In CI: JUnit XML for the test report, and no restart check.
  devmgr sanity --socket-dir /tmp/dp --junit sanity.xml --skip '^restart/'`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runSanity(cmd, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.socketDir, "socket-dir", "", "directory to serve kubelet.sock in, where the plugin puts its socket (created if missing)")
	f.StringVar(&o.resource, "resource", "", "the resource to check when the plugin registers several (default: the first to register)")
	f.StringVar(&o.junit, "junit", "", "also write the results to this file as JUnit XML")
	f.StringVar(&o.skip, "skip", "", "skip the checks whose names (such as allocate/cdi) match this regular expression")
	f.DurationVar(&o.registerTimeout, "register-timeout", 30*time.Second, "how long to wait for the plugin's first registration")
	f.DurationVar(&o.reregisterTimeout, "reregister-timeout", 60*time.Second, "how long the restart check waits for the plugin to register again")
	f.DurationVar(&o.listTimeout, "list-timeout", 10*time.Second, "how long to wait for a device list")
	f.DurationVar(&o.callTimeout, "call-timeout", 10*time.Second, "how long each call to the plugin but PreStartContainer may take, the dial-back during Register and a client's handshake on kubelet.sock included")
	f.DurationVar(&o.preStartTimeout, "prestart-timeout", 30*time.Second, "how long PreStartContainer may take (the kubelet's 30s)")
	f.IntVar(&o.parallel, "parallel", 8, "how many Allocate calls the concurrency check makes at once")
	f.IntVar(&o.maxDevices, "max-devices-per-container", 2, "the most devices the plugin gives one container: 1 for a plugin of shared devices that refuses more")
	f.BoolVarP(&o.quiet, "quiet", "q", false, "say nothing while the checks run; print only the results")
	f.BoolVar(&o.asJSON, "json", false, "print the results as one JSON document: {resource, endpoint, results: [{name, status, messages, duration}]}")
	f.BoolVar(&o.podInfo, "pod-info", false, "name a pod (sanity/sanity-pod, container sanity) in the metadata of every Allocate, GetPreferredAllocation and PreStartContainer call, as devmgr serve --send-pod-info does, for plugins that read it")
	f.IntSliceVar(&o.numaNodes, "numa-nodes", nil, "the NUMA node ids a device's topology may name, such as 0,1 for a plugin that reports the nodes of the machine it will run on (default: this machine's)")
	if err := cmd.MarkFlagRequired("socket-dir"); err != nil {
		panic(err) // a flag defined above
	}
	return cmd
}

// checkList is sanity.Checks() for the help text: the checks of a group on
// one indented line.
func checkList() string {
	var lines []string
	group := ""
	for _, name := range sanity.Checks() {
		g, _, _ := strings.Cut(name, "/")
		if g != group {
			lines = append(lines, "  ")
			group = g
		} else {
			lines[len(lines)-1] += " "
		}
		lines[len(lines)-1] += name
	}
	return strings.Join(lines, "\n")
}

func runSanity(cmd *cobra.Command, o *sanityOptions) error {
	cfg, err := o.config()
	if err != nil {
		return withExitCode(exitUsage, err)
	}
	if !o.quiet {
		cfg.Progress = sanityProgress(cmd.ErrOrStderr(), cfg.RegisterTimeout)
	}
	// Interrupted, the suite still removes kubelet.sock.
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := sanity.Run(ctx, cfg)
	if err != nil {
		if o.junit != "" {
			// CI's report shows why nothing was checked.
			setup := sanity.Report{Results: []sanity.Result{{Name: "sanity/setup", Status: sanity.Failed, Messages: []string{err.Error()}}}}
			if jerr := writeJUnitFile(o.junit, setup); jerr != nil {
				return errors.Join(err, jerr)
			}
		}
		if errors.Is(err, sanity.ErrNotRegistered) {
			return &exitError{code: exitNotFound, err: err}
		}
		return err
	}
	var counts map[sanity.Status]int
	if o.asJSON {
		if counts, err = writeSanityJSON(cmd.OutOrStdout(), rep); err != nil {
			return err
		}
	} else {
		counts = writeSanityText(cmd.OutOrStdout(), cfg.SocketDir, rep)
	}
	if o.junit != "" {
		if err := writeJUnitFile(o.junit, rep); err != nil {
			return err
		}
	}
	if n := counts[sanity.Failed]; n > 0 {
		return fmt.Errorf("%d of %d checks failed", n, len(rep.Results))
	}
	return nil
}

// config checks the flags; each error names the flag to change.
func (o *sanityOptions) config() (sanity.Config, error) {
	cfg := sanity.Config{ResourceName: o.resource}
	var err error
	if cfg.SocketDir, err = absDir("--socket-dir", o.socketDir); err != nil {
		return cfg, err
	}
	if o.skip != "" {
		if cfg.Skip, err = regexp.Compile(o.skip); err != nil {
			return cfg, fmt.Errorf("--skip: %w", err)
		}
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{
		{"--register-timeout", o.registerTimeout}, {"--reregister-timeout", o.reregisterTimeout},
		{"--list-timeout", o.listTimeout}, {"--call-timeout", o.callTimeout}, {"--prestart-timeout", o.preStartTimeout},
	} {
		if d.v <= 0 {
			return cfg, fmt.Errorf("%s must be positive, not %s", d.flag, d.v)
		}
	}
	if o.maxDevices < 1 {
		return cfg, fmt.Errorf("--max-devices-per-container must be at least 1, not %d", o.maxDevices)
	}
	if o.parallel < 1 {
		return cfg, fmt.Errorf("--parallel must be at least 1, not %d", o.parallel)
	}
	for _, n := range o.numaNodes {
		if n < 0 || n > 63 {
			return cfg, fmt.Errorf("--numa-nodes: node %d out of range 0-63", n)
		}
	}
	cfg.RegisterTimeout, cfg.ReregisterTimeout = o.registerTimeout, o.reregisterTimeout
	cfg.ListTimeout, cfg.CallTimeout, cfg.PreStartTimeout = o.listTimeout, o.callTimeout, o.preStartTimeout
	cfg.Parallel, cfg.MaxDevicesPerContainer, cfg.NUMANodes = o.parallel, o.maxDevices, o.numaNodes
	if o.podInfo {
		cfg.PodInfo = &sanityPod
	}
	return cfg, nil
}

// sanityProgress returns the Progress of a run that writes a line to w for
// the wait, the registration and each check: its name as it starts, its
// status and duration as it ends.
func sanityProgress(w io.Writer, registerTimeout time.Duration) func(sanity.Progress) {
	return func(p sanity.Progress) {
		switch {
		case p.Waiting != "":
			fmt.Fprintf(w, "Waiting up to %s for a device plugin to register on %s\n", registerTimeout, p.Waiting)
		case p.Registered != "":
			fmt.Fprintf(w, "Registered: %s\n", p.Registered)
		case p.Started != "":
			fmt.Fprintf(w, "%s ... ", p.Started)
		case p.Done != nil && p.Done.Status == sanity.Skipped && len(p.Done.Messages) > 0 &&
			p.Done.Messages[0] == "skipped by the configuration":
			fmt.Fprintf(w, "%s ... skipped (--skip)\n", p.Done.Name)
		case p.Done != nil:
			fmt.Fprintf(w, "%s (%s)\n", p.Done.Status, p.Done.Duration.Round(time.Millisecond))
		}
	}
}

// sanityJSON is the report --json prints.
type sanityJSON struct {
	Resource string             `json:"resource"`
	Endpoint string             `json:"endpoint"`
	Results  []sanityResultJSON `json:"results"`
}

type sanityResultJSON struct {
	Name     string   `json:"name"`
	Status   string   `json:"status"`
	Messages []string `json:"messages"`
	Duration string   `json:"duration"`
}

// writeSanityJSON prints rep as one JSON document and returns the count of
// each status.
func writeSanityJSON(w io.Writer, rep sanity.Report) (map[sanity.Status]int, error) {
	counts := map[sanity.Status]int{}
	out := sanityJSON{Resource: rep.Resource, Endpoint: rep.Endpoint, Results: []sanityResultJSON{}}
	for _, r := range rep.Results {
		counts[r.Status]++
		out.Results = append(out.Results, sanityResultJSON{Name: r.Name, Status: string(r.Status),
			Messages: append([]string{}, r.Messages...), Duration: r.Duration.Round(time.Millisecond).String()})
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return nil, err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return counts, err
}

// writeSanityText writes the summary: the plugin checked, one line per
// check with the messages of a failed or skipped check indented under it,
// and the counts, which it returns.
func writeSanityText(w io.Writer, dir string, rep sanity.Report) map[sanity.Status]int {
	width := len("CHECK")
	for _, r := range rep.Results {
		width = max(width, len(r.Name))
	}
	counts := map[sanity.Status]int{}
	fmt.Fprintf(w, "Checked %s, registered in %s on endpoint %s\n\n", rep.Resource, dir, rep.Endpoint)
	fmt.Fprintf(w, "%-*s  %-7s  %s\n", width, "CHECK", "STATUS", "DURATION")
	for _, r := range rep.Results {
		counts[r.Status]++
		fmt.Fprintf(w, "%-*s  %-7s  %s\n", width, r.Name, r.Status, r.Duration.Round(time.Millisecond))
		if r.Status != sanity.Passed {
			for _, m := range r.Messages {
				fmt.Fprintf(w, "    %s\n", m)
			}
		}
	}
	fmt.Fprintf(w, "\n%d passed, %d failed, %d skipped\n", counts[sanity.Passed], counts[sanity.Failed], counts[sanity.Skipped])
	return counts
}

// The JUnit XML of a report: one test suite, one test case per check, its
// group as the class name.
type junitSuite struct {
	XMLName  xml.Name    `xml:"testsuite"`
	Name     string      `xml:"name,attr"`
	Tests    int         `xml:"tests,attr"`
	Failures int         `xml:"failures,attr"`
	Skipped  int         `xml:"skipped,attr"`
	Time     string      `xml:"time,attr"`
	Cases    []junitCase `xml:"testcase"`
}

type junitCase struct {
	ClassName string        `xml:"classname,attr"`
	Name      string        `xml:"name,attr"`
	Time      string        `xml:"time,attr"`
	Failure   *junitMessage `xml:"failure"`
	Skipped   *junitMessage `xml:"skipped"`
}

// junitMessage is a failure or a skip: the messages on one line in the
// attribute, one a line in the body.
type junitMessage struct {
	Message string `xml:"message,attr"`
	Text    string `xml:",chardata"`
}

func newJUnitSuite(rep sanity.Report) junitSuite {
	s := junitSuite{Name: "devmgr sanity", Tests: len(rep.Results)}
	var total time.Duration
	for _, r := range rep.Results {
		group, name, _ := strings.Cut(r.Name, "/")
		c := junitCase{ClassName: group, Name: name, Time: seconds(r.Duration)}
		m := &junitMessage{Message: strings.Join(r.Messages, "; "), Text: strings.Join(r.Messages, "\n")}
		switch r.Status {
		case sanity.Failed:
			c.Failure = m
			s.Failures++
		case sanity.Skipped:
			c.Skipped = m
			s.Skipped++
		}
		total += r.Duration
		s.Cases = append(s.Cases, c)
	}
	s.Time = seconds(total)
	return s
}

func seconds(d time.Duration) string { return fmt.Sprintf("%.3f", d.Seconds()) }

func writeJUnitFile(path string, rep sanity.Report) error {
	b, err := xml.MarshalIndent(newJUnitSuite(rep), "", "  ")
	if err != nil {
		return err
	}
	b = append([]byte(xml.Header), append(b, '\n')...)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("--junit: %w", err)
	}
	return nil
}

package xds

import (
	"context"
	"encoding/xml"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	gosync "sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// h2specCase is one case of h2spec's JUnit report.
type h2specCase struct {
	ID      string // "http2/5.1/1": the section and the case's number in it
	Title   string
	Outcome string // "passed", "failed" or "skipped"
	Why     string
}

// junitReport is the part of h2spec's JUnit report read here.
type junitReport struct {
	Suites []struct {
		Package string `xml:"package,attr"`
		Name    string `xml:"name,attr"`
		Cases   []struct {
			Package   string `xml:"package,attr"`
			ClassName string `xml:"classname,attr"`
			Error     *struct {
				Message string `xml:"message,attr"`
				Text    string `xml:",chardata"`
			} `xml:"error"`
			FailureText *struct {
				Text string `xml:",chardata"`
			} `xml:"failure"`
			Skipped *struct {
				Message string `xml:"message,attr"`
			} `xml:"skipped"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

// runH2Spec runs h2spec against addr and returns its cases by ID.
func runH2Spec(t *testing.T, bin, addr string) map[string]h2specCase {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	report := filepath.Join(t.TempDir(), "report.xml")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, _ := exec.CommandContext(ctx, bin, "-h", host, "-p", port, "-o", "2", "-j", report).CombinedOutput()
	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatalf("h2spec wrote no report: %v\n%s", err, out)
	}
	var r junitReport
	if err := xml.Unmarshal(b, &r); err != nil {
		t.Fatalf("h2spec's report: %v", err)
	}
	cases := map[string]h2specCase{}
	for _, s := range r.Suites {
		for i, c := range s.Cases {
			pkg := c.Package
			if pkg == "" {
				pkg = s.Package
			}
			id := fmt.Sprintf("%s/%d", pkg, i+1)
			hc := h2specCase{ID: id, Title: c.ClassName, Outcome: "passed"}
			switch {
			case c.Skipped != nil:
				hc.Outcome, hc.Why = "skipped", c.Skipped.Message
			case c.Error != nil:
				hc.Outcome, hc.Why = "failed", strings.TrimSpace(c.Error.Message+" "+c.Error.Text)
			case c.FailureText != nil:
				hc.Outcome, hc.Why = "failed", strings.TrimSpace(c.FailureText.Text)
			}
			cases[id] = hc
		}
	}
	if len(cases) == 0 {
		t.Fatalf("h2spec ran no case:\n%s", out)
	}
	return cases
}

// controlServer is golang.org/x/net/http2's server (the code that
// net/http bundles), unencrypted, on a loopback port: the measure of
// what h2spec's cases ask of a server.
func controlServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "this port serves gRPC only\n")
	})
	//lint:ignore SA1019 x/net's own server is the control, as it serves a connection handed to it
	srv := &http2.Server{}
	quiet := &http.Server{ErrorLog: log.New(io.Discard, "", 0)}
	var wg gosync.WaitGroup
	var mu gosync.Mutex
	conns := map[net.Conn]bool{}
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = true
			mu.Unlock()
			wg.Go(func() {
				//lint:ignore SA1019 as above
				srv.ServeConn(c, &http2.ServeConnOpts{Handler: h, BaseConfig: quiet})
				c.Close()
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// TestH2Spec runs the HTTP/2 conformance suite h2spec against the xDS
// port and against x/net's server in the same run: every case that x/net
// passes, the xDS port passes. H2SPEC names the binary (make test builds
// it with hack/h2spec.sh).
func TestH2Spec(t *testing.T) {
	bin := os.Getenv("H2SPEC")
	if bin == "" {
		t.Skip("H2SPEC is unset: `make test` builds h2spec (hack/h2spec.sh) and sets it")
	}
	_, addr, _ := limitedServer(t, Limits{})
	ours := runH2Spec(t, bin, addr)
	theirs := runH2Spec(t, bin, controlServer(t))
	ids := make([]string, 0, len(theirs))
	for id := range theirs {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, compareCaseIDs)
	count, control := map[string]int{}, map[string]int{}
	for _, id := range ids {
		count[ours[id].Outcome]++
		control[theirs[id].Outcome]++
	}
	t.Logf("h2spec: xDS port %d passed, %d failed, %d skipped of %d; x/net %d passed, %d failed, %d skipped",
		count["passed"], count["failed"], count["skipped"], len(ids), control["passed"], control["failed"], control["skipped"])
	for _, id := range ids {
		if x := theirs[id]; x.Outcome != "passed" {
			t.Logf("h2spec %s (%s): x/net %s", id, x.Title, x.Outcome)
		}
	}
	for _, id := range ids {
		o, x := ours[id], theirs[id]
		if x.Outcome == "passed" && o.Outcome != "passed" {
			t.Errorf("h2spec %s (%s): x/net passes, the xDS port %s: %s", id, x.Title, o.Outcome, o.Why)
		} else if o.Outcome != "passed" {
			t.Logf("h2spec %s (%s): both %s / %s: %s", id, x.Title, o.Outcome, x.Outcome, o.Why)
		}
	}
}

// compareCaseIDs orders "http2/5.1/10" after "http2/5.1/9".
func compareCaseIDs(a, b string) int {
	as, bs := strings.Split(a, "/"), strings.Split(b, "/")
	for i := 0; i < len(as) && i < len(bs); i++ {
		if as[i] == bs[i] {
			continue
		}
		if c := compareDotted(as[i], bs[i]); c != 0 {
			return c
		}
	}
	return len(as) - len(bs)
}

func compareDotted(a, b string) int {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(as) && i < len(bs); i++ {
		var x, y int
		_, ex := fmt.Sscan(as[i], &x)
		_, ey := fmt.Sscan(bs[i], &y)
		if ex != nil || ey != nil {
			if c := strings.Compare(as[i], bs[i]); c != 0 {
				return c
			}
			continue
		}
		if x != y {
			return x - y
		}
	}
	return len(as) - len(bs)
}

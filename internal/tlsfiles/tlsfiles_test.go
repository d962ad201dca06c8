package tlsfiles

import (
	"crypto/x509"
	"encoding/pem"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/iidp/metasync/test/testenv"
)

// TestCertificateReload: a rotated pair is served from the next handshake
// after CheckEvery; a pair that does not load is logged once and the last
// good one keeps answering; the files are not read more than once per
// CheckEvery whatever the handshakes.
func TestCertificateReload(t *testing.T) {
	ca := testenv.NewCA(t, "ca")
	c1, k1, s1 := ca.Issue(t, "127.0.0.1")
	vol := testenv.NewSecretVolume(t, c1, k1)
	logs := &testenv.Buffer{}
	cert, err := NewCertificate(vol.Cert(), vol.Key(), slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	cert.every = 50 * time.Millisecond
	serial := func() string {
		c, err := cert.GetCertificate(nil)
		if err != nil {
			t.Fatal(err)
		}
		return c.Leaf.SerialNumber.String()
	}
	if got := serial(); got != s1.String() {
		t.Fatalf("serial %s, want %s", got, s1)
	}
	c2, k2, s2 := ca.Issue(t, "127.0.0.1")
	vol.Update(t, c2, k2)
	if got := serial(); got != s1.String() {
		t.Fatalf("read again before CheckEvery: serial %s", got)
	}
	time.Sleep(60 * time.Millisecond)
	if got := serial(); got != s1.String() {
		t.Fatalf("at the first look that reads the new files: serial %s, want still %s", got, s1)
	}
	time.Sleep(60 * time.Millisecond)
	if got := serial(); got != s2.String() {
		t.Fatalf("after the rotation, read twice alike: serial %s, want %s", got, s2)
	}
	bad, _, _ := ca.Issue(t, "127.0.0.1")
	vol.Update(t, bad, k1) // a key of another certificate
	for range 5 {
		time.Sleep(60 * time.Millisecond)
		if got := serial(); got != s2.String() {
			t.Fatalf("after a broken pair: serial %s, want the last good %s", got, s2)
		}
	}
	if n := strings.Count(logs.String(), "TLS certificate not reloaded"); n != 1 {
		t.Fatalf("the broken pair logged %d times, want once:\n%s", n, logs)
	}
	c3, k3, s3 := ca.Issue(t, "127.0.0.1")
	vol.Update(t, c3, k3)
	time.Sleep(60 * time.Millisecond)
	serial()
	time.Sleep(60 * time.Millisecond)
	if got := serial(); got != s3.String() {
		t.Fatalf("a good pair after the broken one: serial %s, want %s", got, s3)
	}
}

// TestReadRefusesWhatIsNoFile: a pipe or a device at a certificate's
// path is refused at once, not read (a pipe would hang the start, a
// device fill the memory).
func TestReadRefusesWhatIsNoFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skip("no FIFO here:", err)
	}
	ca := testenv.NewCA(t, "ca")
	c, k, _ := ca.Issue(t, "127.0.0.1")
	keyFile := filepath.Join(dir, "tls.key")
	_ = os.WriteFile(keyFile, k, 0o600)
	certFile := filepath.Join(dir, "tls.crt")
	_ = os.WriteFile(certFile, c, 0o600)
	for _, path := range []string{fifo, "/dev/zero"} {
		done := make(chan error, 1)
		go func() { _, err := NewCertificate(path, keyFile, slog.New(slog.DiscardHandler)); done <- err }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "not a regular file") {
				t.Errorf("%s: %v, want refused", path, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: still reading after 5 s", path)
		}
		if _, err := CAPool(path); err == nil {
			t.Errorf("CAPool(%s): no error", path)
		}
	}
}

// TestTransportReadsTheCAAtEachConnection: a client's CA file is read at
// each connection: a server whose CA the file does not hold is refused,
// and accepted once the file holds it, with no new client.
func TestTransportReadsTheCAAtEachConnection(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	dir := t.TempDir()
	caFile := testenv.NewCA(t, "another").WriteCA(t, dir, "ca.crt")
	client := &http.Client{Transport: Transport(caFile, "")}
	if _, err := client.Get(srv.URL); err == nil {
		t.Fatal("a server of another CA was accepted")
	}
	var pemCerts []byte
	for _, c := range srv.TLS.Certificates {
		leaf, _ := x509.ParseCertificate(c.Certificate[0])
		pemCerts = append(pemCerts, encodeCert(leaf)...)
	}
	if err := os.WriteFile(caFile, pemCerts, 0o644); err != nil {
		t.Fatal(err)
	}
	// httptest's certificate names example.com and 127.0.0.1.
	resp, err := client.Get(srv.URL)
	if err != nil {
		t.Fatalf("after the CA file changed: %v", err)
	}
	resp.Body.Close()
}

func encodeCert(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

// TestCertificateRefusesWhatWouldBreakClients: a chain file cut short in
// the middle of its intermediate, and a pair that has expired or is not
// valid yet, never replace a valid pair (each refusal logged once); a
// file that is missing is logged once, however many handshakes look.
func TestCertificateRefusesWhatWouldBreakClients(t *testing.T) {
	ca := testenv.NewCA(t, "ca")
	c1, k1, s1 := ca.Issue(t, "127.0.0.1")
	vol := testenv.NewSecretVolume(t, append(c1, ca.PEM...), k1)
	logs := &testenv.Buffer{}
	cert, err := NewCertificate(vol.Cert(), vol.Key(), slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	cert.every = 0
	serve := func() (string, int) {
		t.Helper()
		c, err := cert.GetCertificate(nil)
		if err != nil {
			t.Fatal(err)
		}
		return c.Leaf.SerialNumber.String(), len(c.Certificate)
	}
	if s, n := serve(); s != s1.String() || n != 2 {
		t.Fatalf("serving %s with %d certificates", s, n)
	}
	c2, k2, _ := ca.Issue(t, "127.0.0.1")
	full := append(c2, ca.PEM...)
	vol.Update(t, full[:len(c2)+len(ca.PEM)/2], k2)
	for range 3 {
		if s, n := serve(); s != s1.String() || n != 2 {
			t.Fatalf("a chain cut short: serving %s with %d certificates", s, n)
		}
	}
	for _, c := range []struct{ from, to time.Time }{
		{time.Now().Add(-48 * time.Hour), time.Now().Add(-24 * time.Hour)},
		{time.Now().Add(24 * time.Hour), time.Now().Add(48 * time.Hour)},
	} {
		cx, kx, _ := ca.IssueValid(t, c.from, c.to, "127.0.0.1")
		vol.Update(t, cx, kx)
		for range 3 {
			if s, _ := serve(); s != s1.String() {
				t.Fatalf("a pair valid from %v to %v replaced the valid one", c.from, c.to)
			}
		}
	}
	if n := strings.Count(logs.String(), "TLS certificate not reloaded"); n != 3 {
		t.Errorf("%d refusals logged, want 3 (once each):\n%s", n, logs)
	}
	for _, want := range []string{"cut short", "expired at", "valid from"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("no %q in the log:\n%s", want, logs)
		}
	}
	// The files go: logged once.
	if err := os.RemoveAll(vol.Dir); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		serve()
	}
	if n := strings.Count(logs.String(), "no such file"); n != 1 {
		t.Errorf("a missing file logged %d times, want once:\n%s", n, logs)
	}
	// A chain written in place, its leaf first: the leaf alone is a valid
	// chain of one, but it is never served; the complete chain is, once
	// read twice alike.
	vol = testenv.NewSecretVolume(t, c2, k2)
	cert.certFile, cert.keyFile = vol.Cert(), vol.Key()
	if s, _ := serve(); s != s1.String() {
		t.Fatalf("the leaf alone, read once, is served")
	}
	vol.Update(t, full, k2)
	for range 3 {
		if s, n := serve(); s != s1.String() && n != 2 {
			t.Fatalf("serving %s with %d certificates: the chain was taken cut", s, n)
		}
	}
	if s, n := serve(); s == s1.String() || n != 2 {
		t.Errorf("the complete renewal: serving %s with %d certificates", s, n)
	}
}

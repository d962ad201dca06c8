package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// CA is a certificate authority for tests: it signs serving certificates
// as cert-manager's CA issuer would.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// PEM is the CA certificate, as a client's CA file holds it.
	PEM []byte
}

var serial atomic.Int64

// NewCA makes a CA named name.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(serial.Add(1)),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &CA{cert: cert, key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// WriteCA writes the CA certificate into dir/name and returns its path.
func (ca *CA) WriteCA(t testing.TB, dir, name string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, ca.PEM, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// Issue signs a serving certificate for names (DNS names or IP
// addresses) and returns it and its key in PEM, and its serial number.
func (ca *CA) Issue(t testing.TB, names ...string) (certPEM, keyPEM []byte, serialNumber *big.Int) {
	t.Helper()
	return ca.IssueValid(t, time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour), names...)
}

// IssueValid is Issue with a validity of its own, from notBefore to
// notAfter.
func (ca *CA) IssueValid(t testing.TB, notBefore, notAfter time.Time, names ...string) (certPEM, keyPEM []byte, serialNumber *big.Int) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial.Add(1)),
		Subject:      pkix.Name{CommonName: names[0]},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), tmpl.SerialNumber
}

// SecretVolume is a folder laid out as the kubelet lays out a Secret
// volume of type kubernetes.io/tls: tls.crt and tls.key are symlinks into
// ..data, itself a symlink to a folder of the current version, swapped
// at once by Update (the way cert-manager's renewals reach a pod).
type SecretVolume struct {
	Dir     string
	version int
}

// NewSecretVolume makes the folder with a first certificate and key.
func NewSecretVolume(t testing.TB, certPEM, keyPEM []byte) *SecretVolume {
	t.Helper()
	v := &SecretVolume{Dir: t.TempDir()}
	v.Update(t, certPEM, keyPEM)
	for _, f := range []string{"tls.crt", "tls.key"} {
		if err := os.Symlink(filepath.Join("..data", f), filepath.Join(v.Dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	return v
}

// Cert is the path of the certificate, as a server is given it.
func (v *SecretVolume) Cert() string { return filepath.Join(v.Dir, "tls.crt") }

// Key is the path of the private key.
func (v *SecretVolume) Key() string { return filepath.Join(v.Dir, "tls.key") }

// Update writes a new version and swaps ..data to it atomically.
func (v *SecretVolume) Update(t testing.TB, certPEM, keyPEM []byte) {
	t.Helper()
	v.version++
	name := "..version-" + time.Now().Format("20060102150405") + "-" + big.NewInt(int64(v.version)).String()
	dir := filepath.Join(v.Dir, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), certPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(v.Dir, "..data_tmp")
	_ = os.Remove(tmp)
	if err := os.Symlink(name, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(v.Dir, "..data")); err != nil {
		t.Fatal(err)
	}
}

// ServedSerial connects to addr with TLS, verifying against pool for
// serverName, and returns the serial number of the certificate served.
func ServedSerial(addr, serverName string, pool *x509.CertPool) (*big.Int, error) {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, &tls.Config{RootCAs: pool, ServerName: serverName})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber, nil
}

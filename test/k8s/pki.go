//go:build linux

package k8s

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// PKI is the control plane's key material, written as PEM files into Dir:
// ca.crt/ca.key (a self-signed CA that signs everything else),
// apiserver.crt/.key (serving, for every name and IP in ServerOptions),
// sa.key/sa.pub (service-account token signing) and one client cert/key
// pair per Client call.
type PKI struct {
	Dir    string
	CACert string // path of ca.crt

	ca    *x509.Certificate
	caKey *ecdsa.PrivateKey
}

// NewPKI creates the CA, the API server's serving certificate for ips and
// dnsNames, and the service-account key pair in dir.
func NewPKI(dir string, ips []net.IP, dnsNames []string) (*PKI, error) {
	p := &PKI{Dir: dir, CACert: filepath.Join(dir, "ca.crt")}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: ca key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "vipproxy-test-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(48 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("pki: ca: %w", err)
	}
	if p.ca, err = x509.ParseCertificate(der); err != nil {
		return nil, fmt.Errorf("pki: ca: %w", err)
	}
	p.caKey = key
	if err := p.write("ca", der, key); err != nil {
		return nil, err
	}
	if _, _, err := p.issue("apiserver", pkix.Name{CommonName: "kube-apiserver"}, x509.ExtKeyUsageServerAuth, ips, dnsNames); err != nil {
		return nil, err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: sa key: %w", err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("pki: sa key: %w", err)
	}
	if err := writePEM(filepath.Join(dir, "sa.pub"), "PUBLIC KEY", pub); err != nil {
		return nil, err
	}
	if err := writeKey(filepath.Join(dir, "sa.key"), saKey); err != nil {
		return nil, err
	}
	return p, nil
}

// Path returns the path of a file in the PKI directory ("apiserver.crt").
func (p *PKI) Path(name string) string { return filepath.Join(p.Dir, name) }

// Client issues a client certificate for user in groups (the API server
// maps CN to the user name and O to groups) and returns the paths of the
// certificate and key.
func (p *PKI) Client(name, user string, groups ...string) (cert, key string, err error) {
	return p.issue(name, pkix.Name{CommonName: user, Organization: groups}, x509.ExtKeyUsageClientAuth, nil, nil)
}

// Kubeconfig writes a kubeconfig at path for server (https URL) with the
// client certificate of name (issued with Client) and returns path.
func (p *PKI) Kubeconfig(path, server, name string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: server, CertificateAuthority: p.CACert}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{
		ClientCertificate: p.Path(name + ".crt"),
		ClientKey:         p.Path(name + ".key"),
	}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: name}
	cfg.CurrentContext = "test"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("pki: kubeconfig %s: %w", path, err)
	}
	return nil
}

func (p *PKI) issue(name string, subject pkix.Name, usage x509.ExtKeyUsage, ips []net.IP, dnsNames []string) (string, string, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", fmt.Errorf("pki: %s key: %w", name, err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return "", "", fmt.Errorf("pki: %s serial: %w", name, err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      subject,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(48 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		IPAddresses:  ips,
		DNSNames:     dnsNames,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		return "", "", fmt.Errorf("pki: %s: %w", name, err)
	}
	if err := p.write(name, der, key); err != nil {
		return "", "", err
	}
	return p.Path(name + ".crt"), p.Path(name + ".key"), nil
}

func (p *PKI) write(name string, certDER []byte, key *ecdsa.PrivateKey) error {
	if err := writePEM(p.Path(name+".crt"), "CERTIFICATE", certDER); err != nil {
		return err
	}
	return writeKey(p.Path(name+".key"), key)
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("pki: %s: %w", path, err)
	}
	return writePEM(path, "EC PRIVATE KEY", der)
}

func writePEM(path, typ string, der []byte) error {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	return nil
}

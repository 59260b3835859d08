package tidemark

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
)

// TLS modes of a client connection (TLSConfig.Mode), named like
// PostgreSQL's sslmode.
const (
	// TLSDisable connects in plain text.
	TLSDisable = "disable"
	// TLSRequire encrypts but does not check the server's certificate (it
	// protects against listening, not against a server in the middle).
	TLSRequire = "require"
	// TLSVerifyCA encrypts and checks that the server's certificate is
	// signed by the CA (CAFile, else the system's roots), whatever the
	// name it is issued to.
	TLSVerifyCA = "verify-ca"
	// TLSVerifyFull also checks that the certificate is issued to the
	// server's name (ServerName, else the host of the address).
	TLSVerifyFull = "verify-full"
)

// TLSConfig is how a client connection uses TLS: the source's (source.tls)
// and the Kafka brokers' (target.kafka.tls). Files are PEM.
type TLSConfig struct {
	// Mode is disable, require, verify-ca or verify-full. Its default is
	// the component's (binlog.Config, kafka.Config).
	Mode string
	// CAFile holds the CA certificates the server's certificate must chain
	// to (verify-ca, verify-full); empty: the system's roots.
	CAFile string
	// CertFile and KeyFile are a client certificate and its key, for
	// servers that authenticate clients by certificate; both or neither.
	CertFile, KeyFile string
	// ServerName is the name the certificate must be issued to
	// (verify-full) and the name sent in SNI; empty: the host of the
	// address connected to.
	ServerName string
}

// Verified reports whether the mode checks the server's certificate.
func (c TLSConfig) Verified() bool { return c.Mode == TLSVerifyCA || c.Mode == TLSVerifyFull }

// Validate checks the mode and the files (readable, a CA file with a
// certificate, a matching key pair). Errors name the field after prefix
// ("tls.ca_file: …" for prefix "tls") and never contain a file's content.
func (c TLSConfig) Validate(prefix string) error {
	_, err := c.build(prefix, "")
	return err
}

// ClientConfig returns the crypto/tls configuration of a connection to
// host (the host part of the address dialed), nil for disable. Errors are
// those of Validate.
func (c TLSConfig) ClientConfig(prefix, host string) (*tls.Config, error) {
	return c.build(prefix, host)
}

func (c TLSConfig) build(prefix, host string) (*tls.Config, error) {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%s.%s: %s", prefix, field, fmt.Sprintf(format, args...))
	}
	switch c.Mode {
	case TLSDisable:
		if c.CAFile != "" || c.CertFile != "" || c.KeyFile != "" {
			return nil, bad("mode", "is disable but ca_file, cert_file or key_file is set (remove them or choose require, verify-ca or verify-full)")
		}
		return nil, nil
	case TLSRequire, TLSVerifyCA, TLSVerifyFull:
	default:
		return nil, bad("mode", "must be disable, require, verify-ca or verify-full, got %q", c.Mode)
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.ServerName}
	if tc.ServerName == "" {
		tc.ServerName = host
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		return nil, bad("cert_file", "cert_file and key_file go together (a client certificate and its key)")
	}
	if c.CertFile != "" {
		pair, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, bad("cert_file", "load the client certificate %s and key %s: %v", c.CertFile, c.KeyFile, fileErr(err))
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	var roots *x509.CertPool
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, bad("ca_file", "read %s: %v", c.CAFile, fileErr(err))
		}
		roots = x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return nil, bad("ca_file", "%s holds no PEM certificate", c.CAFile)
		}
	}
	switch c.Mode {
	case TLSRequire:
		tc.InsecureSkipVerify = true
	case TLSVerifyFull:
		tc.RootCAs = roots
	case TLSVerifyCA:
		// The chain is checked, the name is not: crypto/tls has no such
		// mode, so its own check is off and this one replaces it.
		tc.InsecureSkipVerify = true
		tc.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("tls: failed to verify certificate: the server sent none")
			}
			inter := x509.NewCertPool()
			for _, ic := range cs.PeerCertificates[1:] {
				inter.AddCert(ic)
			}
			if _, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter}); err != nil {
				return fmt.Errorf("tls: failed to verify certificate: %w", err)
			}
			return nil
		}
	}
	return tc, nil
}

func fileErr(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// IsLoopback reports whether the host of addr (host:port) is a loopback
// address or "localhost".
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// TLSError explains a failed TLS handshake: a certificate that did not
// verify gets the mode and the CA it was checked with, so that the error
// says which check failed ("TLS certificate not verified (tls mode
// verify-full, CA ca.pem): … x509: certificate signed by unknown
// authority"). The caller names the server. Other errors are returned as
// they are.
func TLSError(c TLSConfig, err error) error {
	if err == nil {
		return nil
	}
	if IsTLSVerifyError(err) {
		ca := c.CAFile
		if ca == "" {
			ca = "the system's roots"
		}
		return fmt.Errorf("TLS certificate not verified (tls mode %s, CA %s): %w", c.Mode, ca, err)
	}
	return err
}

// IsTLSVerifyError reports whether err is a server certificate that did
// not verify: retrying the connection would not change it (every component
// stops with the error instead of retrying).
func IsTLSVerifyError(err error) bool {
	if err == nil {
		return false
	}
	var (
		cve *tls.CertificateVerificationError
		ua  x509.UnknownAuthorityError
		he  x509.HostnameError
		ci  x509.CertificateInvalidError
	)
	return errors.As(err, &cve) || errors.As(err, &ua) || errors.As(err, &he) || errors.As(err, &ci) ||
		strings.Contains(err.Error(), "failed to verify certificate")
}

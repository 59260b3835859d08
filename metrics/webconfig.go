package metrics

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"

	"go.yaml.in/yaml/v3"
	"golang.org/x/crypto/bcrypt"
)

// WebConfig is the ops endpoint's TLS and basic authentication, read from
// a file in the Prometheus exporters' web configuration format (the
// web.config.file of node_exporter and Prometheus:
// https://prometheus.io/docs/prometheus/latest/configuration/https/). This
// is its tls_server_config and basic_auth_users subset, implemented here
// (github.com/prometheus/exporter-toolkit would bring a dozen modules for
// it); other keys are refused, so a file written for another exporter
// never silently drops a setting.
//
//	tls_server_config:
//	  cert_file: /etc/tidemark/ops.pem
//	  key_file: /etc/tidemark/ops-key.pem
//	  client_auth_type: RequireAndVerifyClientCert   # default NoClientCert
//	  client_ca_file: /etc/tidemark/clients-ca.pem
//	  min_version: TLS12                             # TLS10…TLS13, default TLS12
//	basic_auth_users:
//	  prometheus: $2y$10$…                           # bcrypt hash (htpasswd -nBC 10)
type WebConfig struct {
	// TLS is nil for plain HTTP.
	TLS *tls.Config
	// Users maps a user name to its bcrypt password hash; empty: no
	// authentication.
	Users map[string][]byte

	mu    sync.Mutex
	valid map[[32]byte]bool // sha256 of user, password and hash → checked
}

type webFile struct {
	TLS *struct {
		CertFile       string `yaml:"cert_file"`
		KeyFile        string `yaml:"key_file"`
		ClientAuthType string `yaml:"client_auth_type"`
		ClientCAFile   string `yaml:"client_ca_file"`
		MinVersion     string `yaml:"min_version"`
	} `yaml:"tls_server_config"`
	Users map[string]string `yaml:"basic_auth_users"`
}

// LoadWebConfig reads a web configuration file. Errors name the file and
// the key; they never contain a password hash.
func LoadWebConfig(path string) (*WebConfig, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read web config: %w", err)
	}
	var f webFile
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("web config %s: %w", path, err)
	}
	bad := func(key, format string, args ...any) error {
		return fmt.Errorf("web config %s: %s: %s", path, key, fmt.Sprintf(format, args...))
	}
	wc := &WebConfig{Users: map[string][]byte{}, valid: map[[32]byte]bool{}}
	for u, h := range f.Users {
		if _, err := bcrypt.Cost([]byte(h)); err != nil {
			return nil, bad("basic_auth_users."+u, "not a bcrypt hash (make one with htpasswd -nBC 10 %s)", u)
		}
		wc.Users[u] = []byte(h)
	}
	if t := f.TLS; t != nil {
		if t.CertFile == "" || t.KeyFile == "" {
			return nil, bad("tls_server_config", "cert_file and key_file are required")
		}
		pair, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, bad("tls_server_config.cert_file", "load %s and %s: %v", t.CertFile, t.KeyFile, err)
		}
		tc := &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
		switch t.MinVersion {
		case "", "TLS12":
		case "TLS13":
			tc.MinVersion = tls.VersionTLS13
		case "TLS11":
			tc.MinVersion = tls.VersionTLS11
		case "TLS10":
			tc.MinVersion = tls.VersionTLS10
		default:
			return nil, bad("tls_server_config.min_version", "must be TLS10, TLS11, TLS12 or TLS13, got %q", t.MinVersion)
		}
		switch t.ClientAuthType {
		case "", "NoClientCert":
		case "RequestClientCert":
			tc.ClientAuth = tls.RequestClientCert
		case "RequireAnyClientCert", "RequireClientCert":
			tc.ClientAuth = tls.RequireAnyClientCert
		case "VerifyClientCertIfGiven":
			tc.ClientAuth = tls.VerifyClientCertIfGiven
		case "RequireAndVerifyClientCert":
			tc.ClientAuth = tls.RequireAndVerifyClientCert
		default:
			return nil, bad("tls_server_config.client_auth_type", "unknown %q", t.ClientAuthType)
		}
		if t.ClientCAFile != "" {
			pem, err := os.ReadFile(t.ClientCAFile)
			if err != nil {
				return nil, bad("tls_server_config.client_ca_file", "%v", err)
			}
			tc.ClientCAs = x509.NewCertPool()
			if !tc.ClientCAs.AppendCertsFromPEM(pem) {
				return nil, bad("tls_server_config.client_ca_file", "%s holds no PEM certificate", t.ClientCAFile)
			}
		} else if tc.ClientAuth == tls.VerifyClientCertIfGiven || tc.ClientAuth == tls.RequireAndVerifyClientCert {
			return nil, bad("tls_server_config.client_ca_file", "required with client_auth_type %s", t.ClientAuthType)
		}
		wc.TLS = tc
	}
	return wc, nil
}

// authenticate wraps h with basic authentication when Users is set. A
// user's checked password is remembered (by a hash of user, password and
// bcrypt hash), so a scrape does not pay bcrypt's cost each time.
func (wc *WebConfig) authenticate(h http.Handler) http.Handler {
	if wc == nil || len(wc.Users) == 0 {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, pass, ok := r.BasicAuth()
		if ok {
			hash, known := wc.Users[user]
			if !known {
				hash = dummyHash // an unknown user costs what a known one does
			}
			if wc.check(user, pass, hash) && known {
				h.ServeHTTP(w, r)
				return
			}
		}
		w.Header().Set("WWW-Authenticate", `Basic realm="tidemark"`)
		http.Error(w, "unauthorized", http.StatusUnauthorized)
	})
}

// dummyHash is the bcrypt hash (cost 10) of "tidemark: no such user",
// checked for unknown users so that they cost what a known one does. It is a
// literal: generating it at package init cost every tidemark command, even
// `tidemark version`, about 58 ms of CPU (GODEBUG=inittrace=1). Nothing ever
// authenticates against it (the user is unknown whatever the password).
var dummyHash = []byte("$2a$10$As/Q6fjpELUnHvDn6PQ45u8VjvrxIo26lb0.q1KuM3U9c4GKKta7i")

func (wc *WebConfig) check(user, pass string, hash []byte) bool {
	key := sha256.Sum256([]byte(user + "\x00" + pass + "\x00" + string(hash)))
	wc.mu.Lock()
	ok := wc.valid[key]
	wc.mu.Unlock()
	if ok {
		return true
	}
	if bcrypt.CompareHashAndPassword(hash, []byte(pass)) != nil {
		return false
	}
	wc.mu.Lock()
	if len(wc.valid) < 1024 {
		wc.valid[key] = true
	}
	wc.mu.Unlock()
	return true
}

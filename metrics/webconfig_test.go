package metrics

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"tidemark/internal/testcerts"
)

// TestWebConfig: the endpoint with a web.config.file (Prometheus format):
// TLS with a certificate made here, basic authentication with a bcrypt
// hash, and a variant that requires a client certificate. Plain HTTP, no
// credentials, a wrong password or no client certificate are refused; the
// right ones get /metrics, /healthz and the status page. Bad files are
// refused naming the key.
func TestWebConfig(t *testing.T) {
	dir := t.TempDir()
	ca, err := testcerts.NewCA(dir, "ops")
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := ca.Issue(dir, "server", false, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	ccert, ckey, err := ca.Issue(dir, "client", true, "prometheus")
	if err != nil {
		t.Fatal(err)
	}
	const password = "scrape-canary-Pa55"
	hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	pem, _ := os.ReadFile(ca.File)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	pair, err := tls.LoadX509KeyPair(ccert, ckey)
	if err != nil {
		t.Fatal(err)
	}
	serve := func(t *testing.T, file string) string {
		wc, err := LoadWebConfig(file)
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- New().ServeOn(ctx, ln, wc, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
		t.Cleanup(func() { cancel(); <-done })
		return ln.Addr().String()
	}
	do := func(url, user, pass string, clientCert bool) (int, error) {
		tc := &tls.Config{RootCAs: roots}
		if clientCert {
			tc.Certificates = []tls.Certificate{pair}
		}
		// bcrypt under -race on a loaded machine (make test runs packages
		// in parallel) takes seconds per request.
		cl := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
		req, _ := http.NewRequest("GET", url, nil)
		if user != "" {
			req.SetBasicAuth(user, pass)
		}
		resp, err := cl.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}

	addr := serve(t, write("web.yml", "tls_server_config:\n  cert_file: "+cert+"\n  key_file: "+key+"\nbasic_auth_users:\n  prometheus: "+string(hash)+"\n"))
	for _, path := range []string{"/metrics", "/healthz"} {
		if code, err := do("https://"+addr+path, "prometheus", password, false); err != nil || code != 200 {
			t.Fatalf("GET %s with the password: %d %v", path, code, err)
		}
	}
	// The status page (none set here: 404) is behind the same check.
	if code, err := do("https://"+addr+"/", "", "", false); err != nil || code != http.StatusUnauthorized {
		t.Fatalf("GET / without credentials: %d %v", code, err)
	}
	for _, c := range []struct{ name, user, pass string }{{"no credentials", "", ""}, {"wrong password", "prometheus", "nope"}, {"unknown user", "root", password}} {
		if code, err := do("https://"+addr+"/metrics", c.user, c.pass, false); err != nil || code != http.StatusUnauthorized {
			t.Fatalf("%s: %d %v, want 401", c.name, code, err)
		}
	}
	if resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + addr + "/metrics"); err == nil && resp.StatusCode == 200 {
		t.Fatal("plain HTTP to the TLS endpoint answered 200")
	}

	mtls := serve(t, write("web-mtls.yml", "tls_server_config:\n  cert_file: "+cert+"\n  key_file: "+key+"\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: "+ca.File+"\n  min_version: TLS13\n"))
	if code, err := do("https://"+mtls+"/metrics", "", "", true); err != nil || code != 200 {
		t.Fatalf("with a client certificate: %d %v", code, err)
	}
	if _, err := do("https://"+mtls+"/metrics", "", "", false); err == nil {
		t.Fatal("without a client certificate: answered")
	}

	for _, c := range []struct{ content, want string }{
		{"tls_server_config:\n  cert_file: " + cert + "\n", "tls_server_config: cert_file and key_file are required"},
		{"basic_auth_users:\n  prometheus: " + password + "\n", "basic_auth_users.prometheus: not a bcrypt hash"},
		{"http_server_config:\n  http2: false\n", "field http_server_config not found"},
		{"tls_server_config:\n  cert_file: " + cert + "\n  key_file: " + key + "\n  client_auth_type: RequireAndVerifyClientCert\n", "client_ca_file: required"},
		{"tls_server_config:\n  cert_file: " + cert + "\n  key_file: " + key + "\n  min_version: TLS9\n", "min_version: must be"},
	} {
		_, err := LoadWebConfig(write("bad.yml", c.content))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: got %v, want %q", c.content, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), password) {
			t.Errorf("error holds the password: %v", err)
		}
	}
}

// TestDummyHash: the hash checked for an unknown user is a real bcrypt hash of
// the cost a configured user's is expected to have, so that an unknown user
// takes as long to refuse as a wrong password does.
func TestDummyHash(t *testing.T) {
	cost, err := bcrypt.Cost(dummyHash)
	if err != nil {
		t.Fatalf("dummyHash is not a bcrypt hash: %v", err)
	}
	if cost != 10 {
		t.Fatalf("dummyHash cost = %d, want 10 (what htpasswd -nBC 10 makes)", cost)
	}
	if err := bcrypt.CompareHashAndPassword(dummyHash, []byte("tidemark: no such user")); err != nil {
		t.Fatalf("dummyHash does not match its documented password: %v", err)
	}
}

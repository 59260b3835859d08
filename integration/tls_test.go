package integration

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"tidemark"
	"tidemark/binlog"
	"tidemark/integration/harness"
	"tidemark/internal/testcerts"
	"tidemark/internal/testenv"
)

// tlsEnv is the TLS side of the servers of scripts/services.sh: the CA of
// their certificates and the accounts that accept TLS connections only.
type tlsEnv = testenv.TLSEnv

// tlsEnvFromOS is testenv.KafkaTLS: these tests need every TLS listener.
func tlsEnvFromOS(t *testing.T) tlsEnv {
	t.Helper()
	return testenv.KafkaTLS(t)
}

func writeSecret(t *testing.T, name, value string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(value+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestTLSSourceAndPostgres: the daemon reads the source through an account
// that requires TLS (source.tls with the CA: verify-full, the password from
// password_file) and writes PostgreSQL through a role that only a hostssl
// rule admits (sslmode=verify-full with sslrootcert, the DSN from
// dsn_file): the first run's catch-up and the stream after it arrive,
// verify finds the tables equal, doctor reports the source's TLS version
// and that its certificate was verified, and the ops endpoint answers
// only over TLS with the basic-auth password of its web_config_file. A CA that did not sign the
// servers' certificates fails doctor with an error naming the server and
// the certificate. No password is printed.
func TestTLSSourceAndPostgres(t *testing.T) {
	f := newFixture(t)
	te := tlsEnvFromOS(t)
	db := testenv.Name("it_tls_")
	f.dropLater(t, db, db)
	if _, err := f.my.Execute("CREATE DATABASE " + db); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"CREATE TABLE " + db + ".t (id INT PRIMARY KEY, v VARCHAR(40), updated_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6))",
		"INSERT INTO " + db + ".t (id, v) VALUES (1, 'before the first run'), (2, 'before the first run')"} {
		if _, err := f.my.Execute(q); err != nil {
			t.Fatal(err)
		}
	}
	// The ops endpoint with TLS and basic authentication (web.config.file).
	dir := t.TempDir()
	opsCA, err := testcerts.NewCA(dir, "ops")
	if err != nil {
		t.Fatal(err)
	}
	opsCert, opsKey, err := opsCA.Issue(dir, "ops", false, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	const opsPassword = "ops-scrape-canary"
	hash, err := bcrypt.GenerateFromPassword([]byte(opsPassword), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	web := writeSecret(t, "web.yml", "tls_server_config:\n  cert_file: "+opsCert+"\n  key_file: "+opsKey+"\nbasic_auth_users:\n  prometheus: "+string(hash))
	opsAddr := fmt.Sprintf("127.0.0.1:%d", freeLoopbackPort(t))
	cfg := f.configYAMLWith(t, db, db, db, "UTC", tidemark.Position{}, fmt.Sprintf("fallback:\n  tables:\n    %s.t: {column: updated_at}\nmetrics:\n  listen: %s\n  web_config_file: %s\n", db, opsAddr, web))
	setSourceOption(t, cfg, "user", te.MySQLUser)
	setSourceOption(t, cfg, "password", "")
	setSourceOption(t, cfg, "password_file", writeSecret(t, "mysql-password", te.MySQLPass))
	setSourceOption(t, cfg, "tls", "{ca_file: "+te.CA+"}")
	b, _ := os.ReadFile(cfg)
	y := strings.Replace(string(b), "    dsn: ${TM_IT_PG_DSN}", "    dsn_file: "+writeSecret(t, "pg-dsn", te.PGDSN), 1)
	y = strings.Replace(y, "  password: \n", "", 1)
	if err := os.WriteFile(cfg, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}

	d := f.startDaemon(t, cfg)
	defer d.kill()
	testenv.WaitFor(60*time.Second, func() bool { return d.exited() || strings.Contains(d.stderr.String(), "msg=starting") })
	if _, err := f.my.Execute("INSERT INTO " + db + ".t (id, v) VALUES (3, 'streamed over tls')"); err != nil {
		t.Fatal(err)
	}
	f.waitCaughtUp(t, db, d)
	f.compare(t, harness.TableSpec{Database: db, Table: "t", SourceZone: "UTC"})
	pem, _ := os.ReadFile(opsCA.File)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	for _, c := range []struct {
		user, pass string
		want       int
	}{{"prometheus", opsPassword, 200}, {"", "", 401}, {"prometheus", "wrong", 401}} {
		req, _ := http.NewRequest("GET", "https://"+opsAddr+"/metrics", nil)
		if c.user != "" {
			req.SetBasicAuth(c.user, c.pass)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("GET /metrics over TLS: %v", err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.want || c.want == 200 && !strings.Contains(string(body), "# HELP tidemark_") {
			t.Fatalf("GET /metrics as %q: %d, want %d", c.user, resp.StatusCode, c.want)
		}
	}
	if code := d.stop(t); code != 0 {
		t.Fatalf("daemon exit %d:\n%s", code, tail(d.stderr.String(), 30))
	}
	logs := d.stderr.String()

	code, out := runBinary(t, 2*time.Minute, nil, "verify", "--config", cfg)
	if code != 0 {
		t.Fatalf("verify over TLS: exit %d:\n%s", code, tail(out, 30))
	}
	logs += out
	code, out = runBinary(t, time.Minute, nil, "doctor", "--config", cfg)
	if !hasCheck(out, "ok", "source TLS", "certificate verified (verify-full: CA "+te.CA+", name 127.0.0.1)") || !regexpContains(out, `source TLS +TLSv1\.[23]`) {
		t.Fatalf("doctor over TLS: exit %d, no verified source TLS check:\n%s", code, out)
	}
	if !hasCheck(out, "ok", "target connection", "PostgreSQL") || !hasCheck(out, "ok", "target TLS", "certificate verified (verify-full: chain and name 127.0.0.1)") {
		t.Fatalf("doctor: the target's TLS connection failed:\n%s", out)
	}
	logs += out

	// Another CA: both servers' certificates fail to verify.
	other, err := testcerts.NewCA(dir, "other")
	if err != nil {
		t.Fatal(err)
	}
	bad := strings.Replace(cfg, ".yaml", "-other-ca.yaml", 1)
	copyFile(t, cfg, bad)
	setSourceOption(t, bad, "tls", "{ca_file: "+other.File+"}")
	b, _ = os.ReadFile(bad)
	y = strings.Replace(string(b), "sslrootcert="+te.CA, "sslrootcert="+other.File, 1)
	y = regexp.MustCompile(`dsn_file: .*`).ReplaceAllLiteralString(y, "dsn_file: "+writeSecret(t, "pg-dsn-other", strings.Replace(te.PGDSN, "sslrootcert="+te.CA, "sslrootcert="+other.File, 1)))
	if err := os.WriteFile(bad, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out = runBinary(t, time.Minute, nil, "doctor", "--config", bad)
	if code != 1 || !hasCheck(out, "fix", "source connection", "connect to source "+db+" at "+f.env.MySQLAddr+": TLS certificate not verified") ||
		!strings.Contains(out, "certificate signed by unknown authority") {
		t.Fatalf("doctor with another CA: exit %d, want the source's certificate refused:\n%s", code, out)
	}
	if !hasCheck(out, "fix", "target connection", "certificate") {
		t.Fatalf("doctor with another CA: want the target's certificate refused:\n%s", out)
	}
	logs += out
	code, out = runBinary(t, time.Minute, nil, "run", "--config", bad)
	if code == 0 || !strings.Contains(out, "failed to verify certificate: x509: certificate signed by unknown authority") {
		t.Fatalf("run with another CA: exit %d, want a stop naming the certificate:\n%s", code, tail(out, 20))
	}
	logs += out
	// PostgreSQL: plain text to the hostssl-only role is refused by the
	// server naming the rule; sslmode=require connects unverified, which
	// doctor warns about.
	for _, c := range []struct{ sslmode, status, want string }{
		{"disable", "fix", `pg_hba.conf rejects connection for host "127.0.0.1", user "` + strings.SplitN(strings.TrimPrefix(te.PGDSN, "postgres://"), ":", 2)[0] + `", database "tidemark", no encryption`},
		{"require", "warn", "certificate not verified (sslmode require or prefer)"},
	} {
		dsn := regexp.MustCompile(`sslmode=[a-z-]+&sslrootcert=[^&]*`).ReplaceAllLiteralString(te.PGDSN, "sslmode="+c.sslmode)
		p := strings.Replace(cfg, ".yaml", "-pg-"+c.sslmode+".yaml", 1)
		copyFile(t, cfg, p)
		b, _ := os.ReadFile(p)
		y := regexp.MustCompile(`dsn_file: .*`).ReplaceAllLiteralString(string(b), "dsn_file: "+writeSecret(t, "pg-dsn-"+c.sslmode, dsn))
		if err := os.WriteFile(p, []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
		_, out := runBinary(t, time.Minute, nil, "doctor", "--config", p)
		name := "target TLS"
		if c.sslmode == "disable" {
			name = "target connection"
		}
		if !hasCheck(out, c.status, name, c.want) {
			t.Fatalf("doctor with sslmode=%s: want %s %s %q:\n%s", c.sslmode, c.status, name, c.want, out)
		}
		logs += out
	}
	for _, secret := range []string{te.MySQLPass, "tidemark-tls-local", opsPassword, string(hash)} {
		if strings.Contains(logs, secret) {
			t.Fatalf("a password was printed:\n%s", logs)
		}
	}
}

// TestSourceTLSOnTheWire reads the bytes of the source connections
// (through an in-process toxiproxy that copies them): with source.tls no
// row value crosses the wire in clear, with mode disable it does (the
// control that shows the capture sees the rows).
func TestSourceTLSOnTheWire(t *testing.T) {
	f := newFixture(t)
	te := tlsEnvFromOS(t)
	db := testenv.Name("it_wire_")
	f.dropLater(t, db)
	if _, err := f.my.Execute("CREATE DATABASE " + db); err != nil {
		t.Fatal(err)
	}
	if _, err := f.my.Execute("CREATE TABLE " + db + ".t (id INT PRIMARY KEY, v VARCHAR(60))"); err != nil {
		t.Fatal(err)
	}
	for i, mode := range []string{tidemark.TLSVerifyFull, tidemark.TLSDisable} {
		t.Run(mode, func(t *testing.T) {
			p, err := harness.NewFaultProxy("mariadb-wire-"+mode, f.env.MySQLAddr)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			capt, err := p.Capture("downstream")
			if err != nil {
				t.Fatal(err)
			}
			defer capt.Stop()
			r, err := f.my.Execute("SELECT @@gtid_binlog_pos")
			if err != nil {
				t.Fatal(err)
			}
			gtid, _ := r.GetString(0, 0)
			value := testenv.Name("wire-canary-row-value-")
			if _, err := f.my.Execute(fmt.Sprintf("INSERT INTO %s.t VALUES (%d, '%s')", db, i+1, value)); err != nil {
				t.Fatal(err)
			}
			tc, user, pass := tidemark.TLSConfig{Mode: mode, CAFile: te.CA}, te.MySQLUser, te.MySQLPass
			if mode == tidemark.TLSDisable {
				tc, user, pass = tidemark.TLSConfig{Mode: mode}, f.env.MySQLUser, f.env.MySQLPassword
			}
			tl, err := binlog.New(binlog.Config{Name: "wire", Addr: p.Addr, User: user, Password: pass, ServerID: 7100 + uint32(i),
				Include: []string{db + ".*"}, Heartbeat: time.Second, TLS: tc})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(f.ctx, 30*time.Second)
			defer cancel()
			out := make(chan tidemark.Chunk, 8)
			errc := make(chan error, 1)
			go func() { errc <- tl.Stream(ctx, tidemark.Position{GTID: gtid}, out) }()
			got := false
			for !got {
				select {
				case ch := <-out:
					for _, c := range ch.Changes {
						got = got || c.After[1] == value
					}
				case err := <-errc:
					t.Fatalf("stream ended: %v", err)
				case <-ctx.Done():
					t.Fatal("the row did not arrive")
				}
			}
			cancel()
			<-errc
			wire := capt.Bytes()
			if len(wire) < 1000 {
				t.Fatalf("captured only %d bytes", len(wire))
			}
			if clear := bytes.Contains(wire, []byte(value)); clear != (mode == tidemark.TLSDisable) {
				t.Fatalf("mode %s: row value in clear on the wire: %v (captured %d bytes)", mode, clear, len(wire))
			}
		})
	}
}

// TestSourceTLSServerWithout: a server without TLS (a private MariaDB with
// no ssl settings) and source.tls.mode require: the connection is refused
// by tidemark, naming the mode and both ways out, and Stream stops at once.
func TestSourceTLSServerWithout(t *testing.T) {
	f := newFixture(t)
	s := f.startPrivateMariaDB(t, 46)
	tl, err := binlog.New(binlog.Config{Name: "notls", Addr: s.Addr, User: f.env.MySQLUser, Password: f.env.MySQLPassword, ServerID: 7201,
		Heartbeat: time.Second, TLS: tidemark.TLSConfig{Mode: tidemark.TLSRequire}})
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	want := []string{"connect to source notls at " + s.Addr, "does not support TLS", "source.tls.mode is require: enable TLS on the server, or set source.tls.mode: disable"}
	checks := tl.Doctor(f.ctx, nil, time.Hour)
	for _, w := range want {
		if checks[0].Name != "source connection" || !strings.Contains(checks[0].Found, w) {
			t.Fatalf("doctor: %+v lacks %q", checks[0], w)
		}
	}
	ctx, cancel := context.WithTimeout(f.ctx, 20*time.Second)
	defer cancel()
	start := time.Now()
	err = tl.Stream(ctx, tidemark.Position{}, make(chan tidemark.Chunk, 1))
	if err == nil || !strings.Contains(err.Error(), want[1]) || time.Since(start) > 5*time.Second {
		t.Fatalf("Stream after %s: %v", time.Since(start), err)
	}
}

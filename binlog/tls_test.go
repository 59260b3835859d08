package binlog

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tidemark"
	"tidemark/internal/testcerts"
	"tidemark/internal/testenv"
)

// tlsServer is the TLS side of the MariaDB of scripts/services.sh: its CA
// (TIDEMARK_TEST_TLS_CA) and the account that requires TLS.
func tlsServer(t *testing.T) (ca, user, pass string) {
	t.Helper()
	e := testenv.TLS(t)
	return e.CA, e.MySQLUser, e.MySQLPass
}

func tlsConfig(addr, user, pass, db string, tc tidemark.TLSConfig) Config {
	return Config{Name: "tlstest", Addr: addr, User: user, Password: pass, ServerID: testenv.ServerID(),
		Include: []string{db + ".*"}, Heartbeat: time.Second, TLS: tc}
}

func doctorCheck(checks []tidemark.Check, name string) tidemark.Check {
	for _, c := range checks {
		if c.Name == name {
			return c
		}
	}
	return tidemark.Check{}
}

// TestSourceTLSVerifyFull: with source.tls verify-full and the server's CA
// the tailer streams and the reader captures and reads through an account
// that requires TLS (so every connection, the replication stream included,
// is encrypted: the server refuses any other), doctor reports the TLS
// version and that the certificate was verified. The default mode with a
// ca_file is verify-full. A client certificate (cert_file/key_file) is
// sent to an account that REQUIRE X509.
func TestSourceTLSVerifyFull(t *testing.T) {
	addr, _, _, c := testServer(t)
	ca, user, pass := tlsServer(t)
	db := testenv.Name("btls_")
	exec(t, c, "CREATE DATABASE "+db)
	t.Cleanup(func() { _, _ = c.Execute("DROP DATABASE " + db) })
	exec(t, c, "USE "+db, "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(40))")
	from := currentGTID(t, c)
	exec(t, c, "INSERT INTO t VALUES (1, 'over tls')")

	cfg := tlsConfig(addr, user, pass, db, tidemark.TLSConfig{CAFile: ca})
	tl, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if tl.cfg.TLS.Mode != tidemark.TLSVerifyFull {
		t.Fatalf("default mode with a ca_file: %q, want verify-full", tl.cfg.TLS.Mode)
	}
	ctx := context.Background()
	chk := doctorCheck(tl.Doctor(ctx, nil, time.Hour), "source TLS")
	if chk.Status != tidemark.CheckOK || !strings.Contains(chk.Found, "TLSv1.") || !strings.Contains(chk.Found, "certificate verified (verify-full") {
		t.Fatalf("doctor's source TLS check: %+v", chk)
	}
	changes, _ := collect(t, tl, from, 1)
	if len(changes) != 1 || changes[0].After[1] != "over tls" {
		t.Fatalf("streamed %+v", changes)
	}
	r, err := NewReader(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	snap, err := r.Capture(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.Read(ctx, tidemark.ReadRequest{Table: tidemark.TableID{Database: db, Name: "t"}, Limit: 10, Snapshot: snap})
	if err != nil || len(res.Changes) != 1 {
		t.Fatalf("read over TLS: %v, %d rows", err, len(res.Changes))
	}

	// A client certificate signed by the server's CA, for an account that
	// requires one.
	key := filepath.Join(filepath.Dir(ca), "ca.key")
	sca, err := testcerts.LoadCA(ca, key)
	if err != nil {
		t.Fatalf("load the CA of scripts/services.sh: %v", err)
	}
	dir := t.TempDir()
	xuser := testenv.Name("x509_")
	certFile, keyFile, err := sca.Issue(dir, "client", true, xuser)
	if err != nil {
		t.Fatal(err)
	}
	exec(t, c, "SET SESSION sql_log_bin=0", "CREATE USER '"+xuser+"'@'127.0.0.1' IDENTIFIED BY 'x509pw' REQUIRE X509",
		"GRANT SELECT, REPLICATION SLAVE, BINLOG MONITOR ON *.* TO '"+xuser+"'@'127.0.0.1'")
	t.Cleanup(func() { _, _ = c.Execute("DROP USER '" + xuser + "'@'127.0.0.1'") })
	for _, withCert := range []bool{false, true} {
		tc := tidemark.TLSConfig{CAFile: ca}
		if withCert {
			tc.CertFile, tc.KeyFile = certFile, keyFile
		}
		tl, err := New(tlsConfig(addr, xuser, "x509pw", db, tc))
		if err != nil {
			t.Fatal(err)
		}
		chk := doctorCheck(tl.Doctor(ctx, nil, time.Hour), "source connection")
		tl.Close()
		if withCert && chk.Status != tidemark.CheckOK {
			t.Fatalf("REQUIRE X509 account with a client certificate: %+v", chk)
		}
		if !withCert && (chk.Status != tidemark.CheckFix || !strings.Contains(chk.Found, "Access denied")) {
			t.Fatalf("REQUIRE X509 account without a client certificate: %+v", chk)
		}
	}
}

// TestSourceTLSModes: each mode against the TLS server, with the right CA,
// another CA (made here) and a name the certificate is not issued to. A
// certificate that does not verify stops Stream at once (no retries) with
// an error naming the source, its address and the certificate; plain text
// to the account that requires TLS is refused with a hint.
func TestSourceTLSModes(t *testing.T) {
	addr, _, _, c := testServer(t)
	ca, user, pass := tlsServer(t)
	other, err := testcerts.NewCA(t.TempDir(), "other")
	if err != nil {
		t.Fatal(err)
	}
	db := testenv.Name("btls_")
	exec(t, c, "CREATE DATABASE "+db)
	t.Cleanup(func() { _, _ = c.Execute("DROP DATABASE " + db) })
	for _, tc := range []struct {
		name  string
		tls   tidemark.TLSConfig
		found string // doctor's source TLS check (ok cases)
		warn  bool
		err   []string // Stream's error (failures)
	}{
		{name: "require", tls: tidemark.TLSConfig{Mode: "require"}, found: "certificate not verified (mode require)", warn: true},
		{name: "verify-ca other name", tls: tidemark.TLSConfig{Mode: "verify-ca", CAFile: ca, ServerName: "wrong.example"}, found: "certificate verified (verify-ca"},
		{name: "verify-full", tls: tidemark.TLSConfig{Mode: "verify-full", CAFile: ca, ServerName: "localhost"}, found: "name localhost"},
		{name: "verify-full wrong CA", tls: tidemark.TLSConfig{Mode: "verify-full", CAFile: other.File},
			err: []string{"connect to source tlstest at " + addr + ": TLS certificate not verified", "certificate signed by unknown authority", "tls mode verify-full"}},
		{name: "verify-ca wrong CA", tls: tidemark.TLSConfig{Mode: "verify-ca", CAFile: other.File},
			err: []string{"connect to source tlstest at " + addr + ": TLS certificate not verified", "certificate signed by unknown authority"}},
		{name: "verify-full wrong name", tls: tidemark.TLSConfig{Mode: "verify-full", CAFile: ca, ServerName: "wrong.example"},
			err: []string{"connect to source tlstest at " + addr + ": TLS certificate not verified", "certificate is valid for localhost, not wrong.example"}},
		{name: "plain text to a TLS-only account", tls: tidemark.TLSConfig{Mode: "disable"},
			err: []string{"connect to source tlstest at " + addr, "Access denied for user '" + user + "'", "REQUIRE SSL refuses plain-text connections"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tl, err := New(tlsConfig(addr, user, pass, db, tc.tls))
			if err != nil {
				t.Fatal(err)
			}
			defer tl.Close()
			ctx := context.Background()
			checks := tl.Doctor(ctx, nil, time.Hour)
			if tc.err == nil {
				chk := doctorCheck(checks, "source TLS")
				want := tidemark.CheckOK
				if tc.warn {
					want = tidemark.CheckWarn
				}
				if chk.Status != want || !strings.Contains(chk.Found, tc.found) || !strings.Contains(chk.Found, "TLSv1.") {
					t.Fatalf("doctor's source TLS check: %+v, want %s with %q", chk, want, tc.found)
				}
				return
			}
			conn := doctorCheck(checks, "source connection")
			if conn.Status != tidemark.CheckFix || !strings.Contains(conn.Found, tc.err[0]) {
				t.Errorf("doctor's connection check: %+v", conn)
			}
			sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			start := time.Now()
			err = tl.Stream(sctx, tidemark.Position{}, make(chan tidemark.Chunk, 1))
			if err == nil {
				t.Fatal("Stream: no error")
			}
			t.Logf("Stream: %v", err)
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("Stream took %s to fail: retried an error that cannot heal", took)
			}
			for _, w := range tc.err {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Stream's error lacks %q:\n%v", w, err)
				}
			}
			if strings.Contains(err.Error(), pass) {
				t.Errorf("error contains the password: %v", err)
			}
		})
	}
}

// TestSourceTLSConfigErrors: bad TLS settings are refused by Validate,
// naming the field.
func TestSourceTLSConfigErrors(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		tls  tidemark.TLSConfig
		want string
	}{
		{tidemark.TLSConfig{Mode: "on"}, "source config: tls.mode: must be disable, require, verify-ca or verify-full"},
		{tidemark.TLSConfig{CAFile: filepath.Join(dir, "missing.pem")}, "source config: tls.ca_file: read " + dir + "/missing.pem: no such file or directory"},
		{tidemark.TLSConfig{CAFile: notPEM}, "tls.ca_file: " + notPEM + " holds no PEM certificate"},
		{tidemark.TLSConfig{Mode: "require", CertFile: notPEM}, "tls.cert_file: cert_file and key_file go together"},
		{tidemark.TLSConfig{Mode: "disable", CAFile: notPEM}, "tls.mode: is disable but ca_file"},
	} {
		cfg := tlsConfig("db.example:3306", "u", "p", "d", tc.tls)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: got %v, want %q", tc.tls, err, tc.want)
		}
	}
	// Defaults: require off the host, disable on loopback.
	for addr, want := range map[string]string{"db.example:3306": "require", "127.0.0.1:3306": "disable", "localhost:3306": "disable", "[::1]:3306": "disable"} {
		cfg := tlsConfig(addr, "u", "p", "d", tidemark.TLSConfig{})
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		if cfg.TLS.Mode != want {
			t.Errorf("default mode for %s: %q, want %q", addr, cfg.TLS.Mode, want)
		}
	}
}

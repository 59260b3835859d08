package binlog

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/client"
	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"

	"tidemark"
)

// mysql9Server connects to the real MySQL 9.7 of scripts/services.sh; the
// test fails (never skips) without it.
func mysql9Server(t *testing.T) (Config, *client.Conn) {
	t.Helper()
	addr, user, pass := os.Getenv("TIDEMARK_TEST_MYSQL9_ADDR"), os.Getenv("TIDEMARK_TEST_MYSQL9_USER"), os.Getenv("TIDEMARK_TEST_MYSQL9_PASSWORD")
	if addr == "" {
		t.Fatal("TIDEMARK_TEST_MYSQL9_ADDR is not set: run `scripts/services.sh up` (it starts the real MySQL 9.7) and `eval \"$(scripts/services.sh env)\"`")
	}
	c, err := client.Connect(addr, user, pass, "")
	if err != nil {
		t.Fatalf("connect to test MySQL 9.7: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return Config{Name: "my9test", Flavor: FlavorMySQL, Addr: addr, User: user, Password: pass, ServerID: 7391}, c
}

// TestMySQLCachingSHA2Auth: an account with caching_sha2_password (MySQL
// 8's and 9's default) whose password is not in the server's cache (after
// FLUSH PRIVILEGES) needs the full authentication: over TLS the password
// goes in clear inside the tunnel; over plain TCP go-mysql asks the server
// for its RSA public key and sends the password encrypted with it. Both the
// SQL connections and the replication stream must pass, in every TLS mode
// the server's auto-generated certificate allows, and a wrong password must
// stay an access-denied error without the password in it.
func TestMySQLCachingSHA2Auth(t *testing.T) {
	base, c := mysql9Server(t)
	user, pass := randName("tm_sha2_"), "sha2-Pw-"+randName("")
	exec(t, c, "CREATE USER '"+user+"'@'127.0.0.1' IDENTIFIED WITH caching_sha2_password BY '"+pass+"'",
		"GRANT SELECT, RELOAD, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO '"+user+"'@'127.0.0.1'")
	t.Cleanup(func() { _, _ = c.Execute("DROP USER IF EXISTS '" + user + "'@'127.0.0.1'") })
	r, err := c.Execute("SELECT plugin FROM mysql.user WHERE user = ?", user)
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := r.GetString(0, 0); p != "caching_sha2_password" {
		t.Fatalf("plugin %q", p)
	}
	ctx := context.Background()
	for _, mode := range []string{tidemark.TLSDisable, tidemark.TLSRequire, tidemark.TLSVerifyCA} {
		t.Run(mode, func(t *testing.T) {
			cfg := base
			cfg.User, cfg.Password = user, pass
			cfg.TLS = tidemark.TLSConfig{Mode: mode}
			if mode == tidemark.TLSVerifyCA {
				cfg.TLS.CAFile = os.Getenv("TIDEMARK_TEST_MYSQL9_CA")
			}
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			// SQL: full authentication (the cache is empty).
			exec(t, c, "FLUSH PRIVILEGES")
			sc, err := connectSQL(ctx, &cfg)
			if err != nil {
				t.Fatalf("SQL connection with caching_sha2_password, tls %s, empty cache: %v", mode, err)
			}
			sr, err := sc.Execute("SELECT CURRENT_USER(), COALESCE((SELECT VARIABLE_VALUE FROM performance_schema.session_status WHERE VARIABLE_NAME = 'Ssl_cipher'), '')")
			sc.Close()
			if err != nil {
				t.Fatal(err)
			}
			cipher, _ := sr.GetString(0, 1)
			if (cipher != "") != (mode != tidemark.TLSDisable) {
				t.Fatalf("tls %s: Ssl_cipher %q", mode, cipher)
			}
			// Replication: full authentication again, then the first event.
			exec(t, c, "FLUSH PRIVILEGES")
			syc, err := syncerConfig(&cfg, 7392)
			if err != nil {
				t.Fatal(err)
			}
			syncer := replication.NewBinlogSyncer(syc)
			defer syncer.Close()
			gr, err := c.Execute("SELECT REPLACE(@@gtid_executed, '\\n', '')")
			if err != nil {
				t.Fatal(err)
			}
			executed, _ := gr.GetString(0, 0)
			gs, err := mysql.ParseMysqlGTIDSet(executed)
			if err != nil {
				t.Fatal(err)
			}
			st, err := syncer.StartSyncGTID(gs)
			if err != nil {
				t.Fatalf("replication connection with caching_sha2_password, tls %s, empty cache: %v", mode, err)
			}
			ectx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if _, err := st.GetEvent(ectx); err != nil {
				t.Fatalf("replication stream, tls %s: %v", mode, err)
			}
			// A wrong password: access denied, the password not in the text.
			bad := cfg
			bad.Password = "wrong-" + pass
			exec(t, c, "FLUSH PRIVILEGES")
			_, err = connectSQL(ctx, &bad)
			if err == nil || !strings.Contains(err.Error(), "Access denied") || strings.Contains(err.Error(), pass) {
				t.Fatalf("wrong password, tls %s: %v", mode, err)
			}
		})
	}
}

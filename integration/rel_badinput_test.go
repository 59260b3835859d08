package integration

// Bad inputs (docs/RELIABILITY.md): each must give a clear error naming the
// culprit (field, table, column or identifier), and nothing already
// committed may be lost. A canary secret must never be printed.

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// canary returns a secret that must never appear in any output.
func canary() string {
	b := make([]byte, 9)
	_, _ = rand.Read(b)
	return "CANARY-" + hex.EncodeToString(b)
}

// runBinary runs tidemark with args and env and returns its exit code and
// combined stdout and stderr (bounded by timeout).
func runBinary(t *testing.T, timeout time.Duration, env []string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(binPath, args...)
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("tidemark %s did not exit within %s:\n%s", strings.Join(args, " "), timeout, tail(out.String(), 20))
	}
	return cmd.ProcessState.ExitCode(), out.String()
}

// TestBadConfigNamesTheField: malformed YAML, unknown keys, an invalid zone,
// unreadable secret files and a type error next to an expanded secret. Each
// exits 2 (usage) with an error naming the field (or line), and the canary
// (the MariaDB password, from the environment or a file) is never printed.
func TestBadConfigNamesTheField(t *testing.T) {
	secret := canary()
	dir := t.TempDir()
	secretFile := filepath.Join(dir, "password")
	if err := os.WriteFile(secretFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := func(extraSource, extraTop string) string {
		return "source:\n  name: badcfg\n  addr: 127.0.0.1:1\n  user: u\n  server_id: 7\n  time_zone: UTC\n" + extraSource +
			"target:\n  postgres:\n    dsn: postgres://u:" + secret + "@127.0.0.1:1/db?sslmode=disable\n" + extraTop
	}
	cases := []struct {
		name, yaml string
		want       []string
	}{
		{"malformed YAML", "source:\n  name: [unclosed\n  addr: x\n", []string{"parse config", "line"}},
		{"unknown key", base("  password: ${TM_CANARY}\n  heartbeet: 1s\n", ""), []string{"unknown keys", "source.heartbeet"}},
		{"unknown top-level key", base("  password: ${TM_CANARY}\n", "sinks: {}\n"), []string{"unknown keys", "sinks"}},
		{"invalid zone", strings.Replace(base("  password: ${TM_CANARY}\n", ""), "time_zone: UTC", "time_zone: Asia/Kolkatta", 1), []string{"source.time_zone", "Asia/Kolkatta"}},
		{"invalid fold policy", base("  password: ${TM_CANARY}\n  fold: sooner\n", ""), []string{"source.fold", "sooner"}},
		{"missing password file", base("  password_file: "+filepath.Join(dir, "nope")+"\n", ""), []string{"source.password_file", filepath.Join(dir, "nope"), "no such file"}},
		{"password file is a directory", base("  password_file: "+dir+"\n", ""), []string{"source.password_file", "is a directory"}},
		{"password and password file", base("  password: ${TM_CANARY}\n  password_file: "+secretFile+"\n", ""), []string{"source.password_file", "not both"}},
		{"missing dsn file", strings.Replace(base("  password_file: "+secretFile+"\n", ""), "    dsn: postgres://u:"+secret+"@127.0.0.1:1/db?sslmode=disable\n", "    dsn_file: "+filepath.Join(dir, "dsn")+"\n", 1), []string{"target.postgres.dsn_file", "no such file"}},
		{"type error next to a secret", base("  password: ${TM_CANARY}\n  server_id: ${TM_CANARY}\n", ""), []string{"server_id"}},
		{"unset variable", base("  password: ${TM_NOT_SET_ANYWHERE}\n", ""), []string{"TM_NOT_SET_ANYWHERE", "not set"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "bad.yaml")
			if err := os.WriteFile(p, []byte(c.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			code, out := runBinary(t, 30*time.Second, []string{"TM_CANARY=" + secret}, "run", "--config", p)
			if code != 2 {
				t.Errorf("exit code %d, want 2 (usage):\n%s", code, out)
			}
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Errorf("the error does not name %q:\n%s", w, out)
				}
			}
			if strings.Contains(out, secret) {
				t.Errorf("the canary secret was printed:\n%s", out)
			}
		})
	}
}

// TestCanaryNeverPrinted runs the daemon for real with secrets that are
// canaries, at debug level, through success and failure paths: a MariaDB
// user whose password is a canary (read from password_file), killed with
// SIGKILL and restarted; a wrong MariaDB password; a wrong PostgreSQL
// password in dsn_file; a DSN that does not parse. The canary must appear in
// no output, and the failures must say what failed.
func TestCanaryNeverPrinted(t *testing.T) {
	f := newFixture(t)
	secret := canary()
	user := testenv.Name("tmc_")
	if err := harness.Exec(f.my,
		fmt.Sprintf("CREATE USER '%s'@'127.0.0.1' IDENTIFIED BY '%s'", user, secret),
		fmt.Sprintf("CREATE USER '%s'@'localhost' IDENTIFIED BY '%s'", user, secret),
		fmt.Sprintf("GRANT ALL PRIVILEGES ON *.* TO '%s'@'127.0.0.1'", user),
		fmt.Sprintf("GRANT ALL PRIVILEGES ON *.* TO '%s'@'localhost'", user)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = f.my.Execute(fmt.Sprintf("DROP USER IF EXISTS '%s'@'127.0.0.1'", user))
		_, _ = f.my.Execute(fmt.Sprintf("DROP USER IF EXISTS '%s'@'localhost'", user))
	})
	pgRole := testenv.Name("tmc_")
	if _, err := f.pg.Exec(f.ctx, fmt.Sprintf("CREATE ROLE %s LOGIN SUPERUSER PASSWORD '%s'", pgRole, secret)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = f.pg.Exec(f.ctx, "DROP ROLE IF EXISTS "+pgRole) })

	db, start := f.newSource(t, "it_canary_")
	w := newWorkload(t, f, db, "UTC", 50)
	if err := w.Run(30); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	u, err := url.Parse(f.env.PGDSN)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(pgRole, secret)
	goodDSN := write("dsn", u.String())
	u.User = url.UserPassword(f.env.MySQLUser, secret) // wrong password for this role
	wrongDSN := write("wrong-dsn", u.String())
	badDSN := write("bad-dsn", "postgres://"+pgRole+":"+secret+"@127.0.0.1:notaport/x?sslmode=disable")
	pwFile := write("pw", secret+"\n")

	cfgWith := func(userName, dsnFile string) string {
		dc := f.daemon(db, db, db, "UTC", start, "")
		dc.Source.User, dc.Source.Password, dc.Source.PasswordFile = userName, "", pwFile
		dc.Target.Postgres.DSN, dc.Target.Postgres.DSNFile = "", dsnFile
		dc.Log.Level = "debug"
		y, err := dc.YAML()
		if err != nil {
			t.Fatal(err)
		}
		return write(testenv.Name("cfg_")+".yaml", y)
	}
	var all strings.Builder
	// Success path, with a kill and a restart.
	good := cfgWith(user, goodDSN)
	d := f.startDaemon(t, good)
	f.caughtUpIn(t, db, d, time.Minute)
	d.kill()
	all.WriteString(d.stderr.String())
	if err := w.Run(30); err != nil {
		t.Fatal(err)
	}
	d = f.startDaemon(t, good)
	f.caughtUpIn(t, db, d, time.Minute)
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d:\n%s", code, tail(d.stderr.String(), 20))
	}
	all.WriteString(d.stderr.String())
	f.checkEqual(t, harness.TableSpec{Database: db, Table: "orders"})
	code, out := runBinary(t, 30*time.Second, nil, "checkpoint", "--config", good)
	all.WriteString(out)
	if code != 0 {
		t.Errorf("checkpoint: exit %d:\n%s", code, out)
	}
	// Kafka over SASL_SSL with the canary as the SCRAM password (from
	// password_file): a run that publishes, then status and doctor.
	te := tlsEnvFromOS(t)
	ensureSCRAMUser(t, f.kafka(t), user, secret)
	withKafka := func(cfg, saslUser string) string {
		b, err := os.ReadFile(cfg)
		if err != nil {
			t.Fatal(err)
		}
		y := strings.Replace(string(b), "\nbatch:", fmt.Sprintf("\n  kafka:\n    brokers: [%s]\n    topic_prefix: tk%s\n    exactly_once: true\n    tls: {ca_file: %s}\n    sasl: {mechanism: SCRAM-SHA-256, user: %s, password_file: %s}\nbatch:",
			te.KafkaSASL, db, te.CA, saslUser, pwFile), 1)
		return write(testenv.Name("cfg_kafka_")+".yaml", y)
	}
	goodKafka := withKafka(good, user)
	// ... with the ops endpoint on: /metrics and the status page are read too.
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", freeLoopbackPort(t))
	kb, err := os.ReadFile(goodKafka)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(goodKafka, []byte(strings.Replace(string(kb), `listen: "off"`, "listen: "+metricsAddr, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := w.Run(10); err != nil {
		t.Fatal(err)
	}
	d = f.startDaemon(t, goodKafka)
	f.caughtUpIn(t, db, d, time.Minute)
	for _, path := range []string{"/metrics", "/", "/healthz"} {
		resp, err := http.Get("http://" + metricsAddr + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || len(body) == 0 {
			t.Fatalf("GET %s: %d", path, resp.StatusCode)
		}
		all.Write(body)
	}
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d (Kafka over SASL_SSL):\n%s", code, tail(d.stderr.String(), 20))
	}
	all.WriteString(d.stderr.String())
	for _, args := range [][]string{{"status", "--config", goodKafka}, {"doctor", "--config", goodKafka}, {"checkpoint", "--config", goodKafka}} {
		_, out := runBinary(t, time.Minute, nil, args...)
		all.WriteString(out)
	}
	// Failure paths.
	for _, c := range []struct {
		name, cfg string
		want      []string
	}{
		{"wrong MariaDB password", cfgWith(f.env.MySQLUser, goodDSN), []string{"Access denied"}},
		{"wrong PostgreSQL password", cfgWith(user, wrongDSN), []string{"password authentication failed"}},
		{"DSN that does not parse", cfgWith(user, badDSN), []string{"dsn"}},
		{"wrong Kafka SASL password", withKafka(good, te.KafkaUser), []string{"refused the SASL login (SCRAM-SHA-256 as " + te.KafkaUser + ")"}},
	} {
		code, out := runBinary(t, 90*time.Second, nil, "run", "--config", c.cfg)
		all.WriteString(out)
		if code == 0 {
			t.Errorf("%s: exit 0:\n%s", c.name, tail(out, 10))
		}
		for _, want := range c.want {
			if !strings.Contains(out, want) {
				t.Errorf("%s: the error does not say %q:\n%s", c.name, want, tail(out, 10))
			}
		}
	}
	if strings.Contains(all.String(), secret) {
		t.Fatalf("the canary secret was printed:\n%s", grepLines(all.String(), secret))
	}
	t.Logf("%d bytes of daemon output scanned; the canary never appears", all.Len())
}

// quarantinedOrExited waits for the daemon either to exit non-zero or to
// log that it quarantined table; it returns the log.
func quarantinedOrExited(t *testing.T, d *daemonProc, table string) string {
	t.Helper()
	ok := testenv.WaitFor(60*time.Second, func() bool {
		return d.exited() || strings.Contains(grepLines(d.stderr.String(), "quarantine"), table)
	})
	log := d.stderr.String()
	if !ok {
		t.Fatalf("the daemon neither stopped nor quarantined %s within 60 s:\n%s", table, tail(log, 20))
	}
	if d.exited() && d.cmd.ProcessState.ExitCode() == 0 {
		t.Fatalf("the daemon exited 0 on a bad table %s:\n%s", table, tail(log, 20))
	}
	return log
}

// TestTableWithoutKey: a table with neither a primary key nor a declared
// business key cannot be upserted. The daemon says so, naming the table and
// the fix (business_keys); the other tables keep their committed rows (and,
// when the bad table is quarantined rather than stopping the daemon, keep
// streaming).
func TestTableWithoutKey(t *testing.T) {
	f := newFixture(t)
	db, start := f.newSource(t, "it_nokey_")
	w := newWorkload(t, f, db, "UTC", 50)
	if err := w.Run(50); err != nil {
		t.Fatal(err)
	}
	cfg := f.relConfig(t, db, db, relOpts{Start: start})
	d := f.startDaemon(t, cfg)
	t.Cleanup(func() {
		if !d.exited() {
			d.kill()
		}
	})
	f.caughtUpIn(t, db, d, time.Minute)
	if err := harness.Exec(f.my, "CREATE TABLE "+db+".nokey (a INT, b VARCHAR(10))", "INSERT INTO "+db+".nokey VALUES (1, 'x'), (1, 'x'), (2, 'y')"); err != nil {
		t.Fatal(err)
	}
	if err := w.Run(50); err != nil {
		t.Fatal(err)
	}
	log := quarantinedOrExited(t, d, db+".nokey")
	exited := d.exited()
	for _, want := range []string{db + ".nokey", "primary key", "business_keys"} {
		if !strings.Contains(log, want) {
			t.Errorf("the error does not say %q:\n%s", want, grepLines(log, "level=ERROR"))
		}
	}
	if !d.exited() {
		f.caughtUpIn(t, db, d, time.Minute)
		if code := d.stop(t); code != 0 {
			t.Fatalf("exit %d", code)
		}
	}
	// Nothing committed is lost; streaming went on for the good table when
	// the bad one was quarantined.
	var n int
	if err := f.pg.QueryRow(f.ctx, fmt.Sprintf("SELECT count(*) FROM %s", pgx.Identifier{db, "orders"}.Sanitize())).Scan(&n); err != nil || n == 0 {
		t.Fatalf("orders lost its rows: %d, %v", n, err)
	}
	if strings.Contains(log, "quarantine") {
		f.checkEqual(t, harness.TableSpec{Database: db, Table: "orders"})
	}
	report(t, "bad-input-no-key", figures{"quarantined": strings.Contains(log, "quarantine"), "exited": exited})
}

// TestHostileIdentifiers: database objects whose names hold a double
// quote, a backtick or a semicolon (the stuff of SQL injection) are refused
// with an error naming the identifier; nothing is created for them in the
// target, and the well-named table keeps its rows.
func TestHostileIdentifiers(t *testing.T) {
	for _, c := range []struct{ name, ddl, insert, culprit string }{
		{"quote in table", "CREATE TABLE `we\"ird` (id INT PRIMARY KEY)", "INSERT INTO `we\"ird` VALUES (1)", `we"ird`},
		{"backtick in table", "CREATE TABLE `back``tick` (id INT PRIMARY KEY)", "INSERT INTO `back``tick` VALUES (1)", "back`tick"},
		{"semicolon in table", "CREATE TABLE `x; DROP TABLE orders; --` (id INT PRIMARY KEY)", "INSERT INTO `x; DROP TABLE orders; --` VALUES (1)", "x; DROP TABLE orders; --"},
		{"quote and semicolon in column", "CREATE TABLE colbad (id INT PRIMARY KEY, `c\"1;` INT)", "INSERT INTO colbad VALUES (1, 2)", `c"1;`},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t)
			db := testenv.Name("it_ident_")
			f.dropLater(t, db, db)
			start, err := harness.SourcePosition(f.my)
			if err != nil {
				t.Fatal(err)
			}
			w := newWorkload(t, f, db, "UTC", 10)
			if err := w.Run(20); err != nil {
				t.Fatal(err)
			}
			cfg := f.relConfig(t, db, db, relOpts{Start: start})
			d := f.startDaemon(t, cfg)
			t.Cleanup(func() {
				if !d.exited() {
					d.kill()
				}
			})
			f.caughtUpIn(t, db, d, time.Minute)
			if err := harness.Exec(f.my, "USE "+db, c.ddl, c.insert); err != nil {
				t.Fatal(err)
			}
			ok := testenv.WaitFor(30*time.Second, func() bool {
				return d.exited() || strings.Contains(d.stderr.String(), "invalid identifier")
			})
			log := d.stderr.String()
			if !ok {
				t.Fatalf("no error about the identifier %q within 30 s:\n%s", c.culprit, tail(log, 20))
			}
			// The name is %q-quoted in the error, which the text log
			// handler quotes once more.
			q1 := strconv.Quote(c.culprit)
			q2 := strconv.Quote(q1)
			if !strings.Contains(log, c.culprit) && !strings.Contains(log, q1[1:len(q1)-1]) && !strings.Contains(log, q2[1:len(q2)-1]) {
				t.Errorf("the error does not name %s:\n%s", q1, grepLines(log, "invalid identifier"))
			}
			if d.exited() && d.cmd.ProcessState.ExitCode() == 0 {
				t.Errorf("exit 0 on a hostile identifier")
			}
			if !d.exited() {
				d.stop(t)
			}
			var n int
			if err := f.pg.QueryRow(f.ctx, "SELECT count(*) FROM information_schema.tables WHERE table_schema = $1 AND table_name <> 'orders'", db).Scan(&n); err != nil || n != 0 {
				t.Errorf("%d unexpected tables in the target schema (%v)", n, err)
			}
			if err := f.pg.QueryRow(f.ctx, fmt.Sprintf("SELECT count(*) FROM %s", pgx.Identifier{db, "orders"}.Sanitize())).Scan(&n); err != nil || n == 0 {
				t.Errorf("orders lost its rows: %d, %v", n, err)
			}
		})
	}
}

// pgTimes reads id → to_char(col at UTC) from a target table.
func pgTimes(t *testing.T, f *fixture, schema, table, col string) map[int]string {
	t.Helper()
	rows, err := f.pg.Query(f.ctx, fmt.Sprintf("SELECT id, coalesce(to_char(%s AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US'), 'NULL') FROM %s ORDER BY id",
		pgx.Identifier{col}.Sanitize(), pgx.Identifier{schema, table}.Sanitize()))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[int]string{}
	for rows.Next() {
		var id int
		var s string
		if err := rows.Scan(&id, &s); err != nil {
			t.Fatal(err)
		}
		out[id] = s
	}
	return out
}

// TestTemporalEdges: DST fold and gap values under each policy, the range
// edges of DATETIME and TIMESTAMP, zero dates and invalid dates.
func TestTemporalEdges(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_time_")
	f.dropLater(t, db, db+"_later", db+"_earlier", db+"_error", db+"_zeroerr")
	for _, s := range []string{"_later", "_earlier", "_error", "_zeroerr"} {
		s := s
		t.Cleanup(func() { _, _ = f.pg.Exec(f.ctx, "DROP SCHEMA IF EXISTS "+db+s+" CASCADE") })
	}
	start, err := harness.SourcePosition(f.my)
	if err != nil {
		t.Fatal(err)
	}
	if err := harness.Exec(f.my, "CREATE DATABASE "+db, "USE "+db, "SET time_zone = '+00:00'", "SET sql_mode = 'ALLOW_INVALID_DATES'",
		"CREATE TABLE dst (id INT PRIMARY KEY, dt DATETIME(6) NOT NULL)",
		"INSERT INTO dst VALUES (1, '2026-11-01 01:30:00'), (2, '2026-03-08 02:30:00'), (3, '2026-07-01 12:00:00')",
		"CREATE TABLE edges (id INT PRIMARY KEY, dt DATETIME(6) NULL, ts TIMESTAMP(6) NULL)",
		"INSERT INTO edges VALUES (1, '1000-01-01 00:00:00', '1970-01-01 00:00:01'), (2, '9999-12-31 23:59:59.999999', '2038-01-19 03:14:07.999999')",
		"SET sql_mode = ''",
		"CREATE TABLE zero (id INT PRIMARY KEY, d DATE NULL, dt DATETIME(6) NULL, ts TIMESTAMP(6) NULL)",
		"INSERT INTO zero VALUES (1, '0000-00-00', '0000-00-00 00:00:00', '0000-00-00 00:00:00'), (2, '2026-05-00', '2026-05-00 10:00:00', NULL), (3, '2026-05-01', '2026-05-01 10:00:00', '2026-05-01 10:00:00')",
		"SET sql_mode = 'ALLOW_INVALID_DATES'",
		"CREATE TABLE invalid_dt (id INT PRIMARY KEY, dt DATETIME(6) NULL)",
		"INSERT INTO invalid_dt VALUES (1, '2026-02-30 10:00:00')",
		"CREATE TABLE invalid_d (id INT PRIMARY KEY, d DATE NULL)",
		"INSERT INTO invalid_d VALUES (1, '2026-04-31')",
		"CREATE TABLE fine (id INT PRIMARY KEY, v INT)",
		"INSERT INTO fine VALUES (1, 1)"); err != nil {
		t.Fatal(err)
	}
	type run struct {
		suffix, zone string
		source       []string
	}
	runs := []run{
		{"_later", "America/New_York", nil},
		{"_earlier", "America/New_York", []string{"fold: earlier", "gap: earlier"}},
		{"_error", "America/New_York", []string{"fold: error", "gap: error"}},
		{"_zeroerr", "UTC", []string{"zero_dates: error"}},
	}
	logs := map[string]string{}
	for _, r := range runs {
		cfg := f.relConfig(t, db+r.suffix, db, relOpts{Start: start, Zone: r.zone, Source: r.source, TargetSchema: db + r.suffix})
		d := f.startDaemon(t, cfg)
		// Wait for the last table to arrive, or for the daemon to stop.
		testenv.WaitFor(60*time.Second, func() bool {
			var ok bool
			_ = f.pg.QueryRow(f.ctx, "SELECT to_regclass($1) IS NOT NULL", db+r.suffix+".fine").Scan(&ok)
			return ok || d.exited()
		})
		if !d.exited() {
			f.caughtUpIn(t, db+r.suffix, d, time.Minute)
			d.stop(t)
		}
		logs[r.suffix] = d.stderr.String()
	}
	utc := func(zone string, y int, mo time.Month, d, h, mi, s, us int) string {
		return time.Date(y, mo, d, h, mi, s, us*1000, mustZone(zone)).UTC().Format("2006-01-02 15:04:05.000000")
	}
	// DST: later (default): fold → EST (06:30Z), gap → shifted forward (03:30 EDT = 07:30Z).
	got := pgTimes(t, f, db+"_later", "dst", "dt")
	want := map[int]string{1: "2026-11-01 06:30:00.000000", 2: "2026-03-08 07:30:00.000000", 3: "2026-07-01 16:00:00.000000"}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("DST later: row %d is %q, want %q", id, got[id], w)
		}
	}
	// earlier: fold → EDT (05:30Z), gap → the offset after the gap (01:30 EST = 06:30Z).
	got = pgTimes(t, f, db+"_earlier", "dst", "dt")
	want = map[int]string{1: "2026-11-01 05:30:00.000000", 2: "2026-03-08 06:30:00.000000", 3: "2026-07-01 16:00:00.000000"}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("DST earlier: row %d is %q, want %q", id, got[id], w)
		}
	}
	// error: the table is refused with an error naming the column, nothing
	// of it is written with a guessed value.
	if l := logs["_error"]; !strings.Contains(l, "dst.dt") || !(strings.Contains(l, "ambiguous") || strings.Contains(l, "nonexistent")) {
		t.Errorf("fold/gap policy error: no error naming dst.dt:\n%s", grepLines(l, "level=ERROR"))
	}
	var fine int
	_ = f.pg.QueryRow(f.ctx, "SELECT count(*) FROM "+pgx.Identifier{db + "_error", "fine"}.Sanitize()).Scan(&fine)
	if fine == 0 && strings.Contains(logs["_error"], "quarantine") {
		t.Errorf("fold/gap policy error: the other tables did not arrive")
	}
	// Range edges, in New York (1000-01-01 is local mean time, -4:56:02;
	// 9999-12-31 23:59:59.999999 local is in the year 10000 UTC).
	got = pgTimes(t, f, db+"_later", "edges", "dt")
	want = map[int]string{1: utc("America/New_York", 1000, 1, 1, 0, 0, 0, 0), 2: "10000-01-01 04:59:59.999999"}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("DATETIME edge: row %d is %q, want %q", id, got[id], w)
		}
	}
	got = pgTimes(t, f, db+"_later", "edges", "ts")
	want = map[int]string{1: "1970-01-01 00:00:01.000000", 2: "2038-01-19 03:14:07.999999"}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("TIMESTAMP edge: row %d is %q, want %q", id, got[id], w)
		}
	}
	// Zero dates (zero_dates: null, the default): NULL, and counted.
	for _, col := range []string{"d", "dt", "ts"} {
		got = pgTimes(t, f, db+"_later", "zero", col)
		if got[1] != "NULL" {
			t.Errorf("zero %s: row 1 is %q, want NULL", col, got[1])
		}
	}
	if got = pgTimes(t, f, db+"_later", "zero", "dt"); got[2] != "NULL" || got[3] != utc("America/New_York", 2026, 5, 1, 10, 0, 0, 0) {
		t.Errorf("zero-in-date / valid date: %v", got)
	}
	// zero_dates: error names the column.
	if l := logs["_zeroerr"]; !strings.Contains(l, "zero.") || !strings.Contains(l, "zero date") {
		t.Errorf("zero_dates=error: no error naming the column:\n%s", grepLines(l, "level=ERROR"))
	}
	// Invalid dates (ALLOW_INVALID_DATES): a DATE 2026-04-31 is refused
	// with an error naming the column; a DATETIME 2026-02-30 must never be
	// silently moved to another day.
	if l := logs["_later"]; !strings.Contains(l, "invalid_d.d") {
		t.Errorf("invalid DATE: no error naming invalid_d.d:\n%s", grepLines(l, "level=ERROR"))
	}
	if l := logs["_later"]; !strings.Contains(l, "invalid_dt.dt") {
		t.Errorf("invalid DATETIME: no error naming invalid_dt.dt:\n%s", grepLines(l, "level=ERROR"))
	}
	t.Run("invalid DATETIME is never shifted", func(t *testing.T) {
		var shifted []string
		for _, s := range []string{"_later", "_earlier"} {
			var exists bool
			if err := f.pg.QueryRow(f.ctx, "SELECT to_regclass($1) IS NOT NULL", pgx.Identifier{db + s, "invalid_dt"}.Sanitize()).Scan(&exists); err != nil {
				t.Fatal(err)
			}
			if !exists {
				continue // quarantined before anything was written: nothing shifted
			}
			for id, v := range pgTimes(t, f, db+s, "invalid_dt", "dt") {
				if v != "NULL" {
					shifted = append(shifted, fmt.Sprintf("%s row %d: %s", s, id, v))
				}
			}
		}
		if len(shifted) > 0 {
			t.Errorf("DATETIME '2026-02-30 10:00:00' (ALLOW_INVALID_DATES) was silently stored as another date: %v; want an error naming invalid_dt.dt (as for a DATE) or NULL\n"+
				"(go-mysql's ParseTime builds time.Date(2026, 2, 30, …), which normalizes to March 2; binlog/values.go convDateTime accepts it)", shifted)
		}
	})
}

// TestHotKeyTenThousandUpdatesOneFlush: one transaction updates one key
// 10,000 times; it reaches the sink as one batch, is coalesced to a single
// upsert of the newest version, and the stats add up.
func TestHotKeyTenThousandUpdatesOneFlush(t *testing.T) {
	f := newFixture(t)
	db, start := f.newSource(t, "it_hot_")
	if err := harness.Exec(f.my, "CREATE DATABASE "+db, "USE "+db, "CREATE TABLE hot (id INT PRIMARY KEY, n BIGINT NOT NULL, note VARCHAR(32))",
		"INSERT INTO hot VALUES (1, 0, 'start'), (2, 0, 'cold')"); err != nil {
		t.Fatal(err)
	}
	cfg := f.relConfig(t, db, db, relOpts{Start: start, NoBatch: true, Extra: "batch:\n  max_delay: 2s\n"})
	watchI5(t, f, db)
	d := f.startDaemon(t, cfg)
	f.caughtUpIn(t, db, d, time.Minute)
	i5Watched(t, f, db, "hot")
	my, err := f.env.MySQL()
	if err != nil {
		t.Fatal(err)
	}
	defer my.Close()
	if err := harness.Exec(my, "USE "+db, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 10000; i++ {
		if _, err := my.Execute(fmt.Sprintf("UPDATE hot SET n = %d, note = 'v%d' WHERE id = 1", i, i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := harness.Exec(my, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	f.caughtUpIn(t, db, d, time.Minute)
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d", code)
	}
	f.checkEqual(t, harness.TableSpec{Database: db, Table: "hot"})
	checkI5(t, f, db, false)
	var n int64
	var seq int64
	var idx int32
	if err := f.pg.QueryRow(f.ctx, fmt.Sprintf("SELECT n, _tm_seq, _tm_idx FROM %s WHERE id = 1", pgx.Identifier{db, "hot"}.Sanitize())).Scan(&n, &seq, &idx); err != nil {
		t.Fatal(err)
	}
	if n != 10000 || idx != 10000 {
		t.Errorf("hot key: n = %d, version index %d; want 10000 and the 10,000th change", n, idx)
	}
	// The clean-stop line totals this run: 10,000 updates became one
	// upsert; the rest were coalesced (by the sink or the dedupe window).
	line := grepLines(d.stderr.String(), "stopped cleanly")
	stat := func(k string) int {
		i := strings.Index(line, k+"=")
		if i < 0 {
			return -1
		}
		var v int
		fmt.Sscanf(line[i+len(k)+1:], "%d", &v)
		return v
	}
	upd, coal, skip, ins := stat("updated"), stat("coalesced"), stat("skipped"), stat("inserted")
	t.Logf("clean stop: %s", line)
	if upd != 1 || ins != 2 || upd+coal+skip != 10000 {
		t.Errorf("stats: inserted=%d updated=%d coalesced=%d skipped=%d; want inserted=2 (the first rows), updated=1, updated+coalesced+skipped=10000", ins, upd, coal, skip)
	}
	report(t, "bad-input-hot-key", figures{"updates": 10000, "updated": upd, "coalesced": coal, "skipped": skip})
}

package integration

import (
	"strings"
	"testing"
	"time"

	"tidemark"
	"tidemark/internal/testenv"
)

// TestDoctor: `tidemark doctor` on a private MariaDB with the settings
// tidemark needs broken one by one prints each as fix with its fix and
// exits 1; once they are fixed it exits 0. `run` refuses the same broken
// binlog setting at start with the same fix.
func TestDoctor(t *testing.T) {
	f := newFixture(t)
	s := f.startPrivateMariaDB(t, 41)
	db := testenv.Name("it_doc_")
	f.dropLater(t, db, db)
	s.root(t, "CREATE DATABASE "+db+`;
CREATE USER 'weak'@'127.0.0.1' IDENTIFIED BY 'weakpw';
GRANT SELECT ON *.* TO 'weak'@'127.0.0.1';
SET GLOBAL binlog_row_metadata = MINIMAL;
SET GLOBAL gtid_strict_mode = OFF;
SET GLOBAL binlog_expire_logs_seconds = 3600;`)
	cfg := f.configYAML(t, db, db, db, "UTC", tidemark.Position{})
	setSourceOption(t, cfg, "addr", s.Addr)
	env := []string{"TM_IT_MYSQL_PASSWORD=" + f.env.MySQLPassword, "TM_IT_PG_DSN=" + f.env.PGDSN}

	code, out := runBinary(t, time.Minute, env, "doctor", "--config", cfg)
	if code != 1 {
		t.Fatalf("doctor with broken settings: exit %d, want 1:\n%s", code, out)
	}
	for _, want := range [][3]string{
		{"fix", "source binlog_row_metadata", "MINIMAL"},
		{"fix", "source gtid_strict_mode", "OFF"},
		{"fix", "source binlog retention", "expire 1h0m0s < lag budget 24h0m0s"},
		{"ok", "source privileges", "ALL PRIVILEGES"},
		{"ok", "target connection", "PostgreSQL"},
	} {
		if !hasCheck(out, want[0], want[1], want[2]) {
			t.Errorf("doctor output lacks %v:\n%s", want, out)
		}
	}
	for _, fix := range []string{"set binlog_row_metadata=FULL", "set gtid_strict_mode=ON", "binlog_expire_logs_seconds = 86400"} {
		if !strings.Contains(out, fix) {
			t.Errorf("doctor output lacks the fix %q:\n%s", fix, out)
		}
	}
	// run refuses the broken binlog setting, with the same fix.
	code, out = runBinary(t, time.Minute, env, "run", "--config", cfg)
	if code == 0 || !strings.Contains(out, "binlog_row_metadata is MINIMAL: set binlog_row_metadata=FULL") {
		t.Fatalf("run with binlog_row_metadata=MINIMAL: exit %d, want a stop naming the fix:\n%s", code, tail(out, 20))
	}
	// A user without replication privileges.
	weak := strings.Replace(cfg, ".yaml", "-weak.yaml", 1)
	copyFile(t, cfg, weak)
	setSourceOption(t, weak, "user", "weak")
	code, out = runBinary(t, time.Minute, []string{"TM_IT_MYSQL_PASSWORD=weakpw", "TM_IT_PG_DSN=" + f.env.PGDSN}, "doctor", "--config", weak)
	if code != 1 || !hasCheck(out, "fix", "source privileges", "missing REPLICATION SLAVE, BINLOG MONITOR") || !strings.Contains(out, "GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.*") {
		t.Fatalf("doctor as a user without replication privileges: exit %d:\n%s", code, out)
	}
	// Fixed: exit 0.
	s.root(t, `SET GLOBAL binlog_row_metadata = FULL;
SET GLOBAL gtid_strict_mode = ON;
SET GLOBAL binlog_expire_logs_seconds = 0;`)
	code, out = runBinary(t, time.Minute, env, "doctor", "--config", cfg)
	if code != 0 || strings.Contains(out, "\nfix ") {
		t.Fatalf("doctor after the fixes: exit %d, want 0:\n%s", code, out)
	}
}

// hasCheck reports whether doctor's table has a row with this status,
// check name and found text.
func hasCheck(out, status, name, found string) bool {
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, status+" ") && strings.Contains(line, " "+name+" ") && strings.Contains(line, found) {
			return true
		}
	}
	return false
}

// TestDoctorMySQL: `tidemark doctor` on the real MySQL 9.7 passes every
// check, among them the row hash the keydiff fallback and `tidemark verify`
// compute on the source (MD5() is gone from MySQL 9.6; SHA2 is checked).
func TestDoctorMySQL(t *testing.T) {
	f := newMySQLFixture(t)
	db := testenv.Name("it_docmy_")
	f.dropLater(t, db, db)
	if _, err := f.my.Execute("CREATE DATABASE " + db); err != nil {
		t.Fatal(err)
	}
	cfg := f.configYAML(t, db, db, db, "UTC", tidemark.Position{})
	env := []string{"TM_IT_MYSQL_PASSWORD=" + f.env.MySQLPassword, "TM_IT_PG_DSN=" + f.env.PGDSN}
	code, out := runBinary(t, time.Minute, env, "doctor", "--config", cfg)
	if code != 0 {
		t.Fatalf("doctor on MySQL 9.7: exit %d, want 0:\n%s", code, out)
	}
	for _, want := range [][3]string{
		{"ok", "source row hash (SHA2)", "matches"},
		{"ok", "source privileges", "grant(s)"},
		{"ok", "source time-zone tables", "UTC known"},
	} {
		if !hasCheck(out, want[0], want[1], want[2]) {
			t.Errorf("doctor output lacks %v:\n%s", want, out)
		}
	}
}

package integration

import (
	"strings"
	"testing"
	"time"

	"tidemark"
	"tidemark/internal/testenv"
)

// TestNULBytesQuarantineTheTable (issue 22 §1b): PostgreSQL text and jsonb
// cannot hold a NUL character, which MySQL text and JSON strings can. On
// both paths — the first-run snapshot and the binlog stream — such a value
// quarantines its table only, with a reason naming the table, the column
// and "NUL byte"; the daemon and the other tables go on
// (docs/type-mapping.md).
func TestNULBytesQuarantineTheTable(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_nul_")
	f.dropLater(t, db, db)
	f.forgetStates(t, db)
	f.exec(t, "CREATE DATABASE "+db, "USE "+db,
		"CREATE TABLE ok (id INT PRIMARY KEY, v TEXT)",
		"CREATE TABLE nt (id INT PRIMARY KEY, v TEXT)",
		"CREATE TABLE nj (id INT PRIMARY KEY, j JSON)",
		"INSERT INTO ok VALUES (1, 'fine')",
		"INSERT INTO nt VALUES (1, 'fine'), (2, CONCAT('a', CHAR(0), 'b'))",
		`INSERT INTO nj VALUES (1, '{"k": "fine"}'), (2, JSON_OBJECT('k', CONCAT('a', CHAR(0), 'b')))`)
	cfg := f.configYAML(t, db, db, db, "UTC", tidemark.Position{})
	d := f.startDaemon(t, cfg)
	defer cleanupDaemon(&d)
	want := map[string]string{
		"nt": `convert value of ` + db + `.nt.v: text contains a NUL byte`,
		"nj": `convert value of ` + db + `.nj.j: JSON string contains a NUL byte`,
	}
	f.waitQuarantined(t, d, db, "snapshot", want)
	f.waitCaughtUp(t, db, d)
	f.compareTable(t, db, "ok")

	// The binlog path: the same values streamed into tables created after
	// the snapshot.
	f.exec(t, "USE "+db,
		"CREATE TABLE st (id INT PRIMARY KEY, v VARCHAR(20))",
		"CREATE TABLE sj (id INT PRIMARY KEY, j JSON)",
		"INSERT INTO st VALUES (1, 'fine')",
		"INSERT INTO sj VALUES (1, '[1]')",
		"INSERT INTO ok VALUES (2, 'fine too')",
		"INSERT INTO st VALUES (2, CONCAT('x', CHAR(0)))",
		`INSERT INTO sj VALUES (2, JSON_ARRAY(CONCAT(CHAR(0), 'y')))`,
		"INSERT INTO ok VALUES (3, 'still fine')")
	want["st"] = `convert value of ` + db + `.st.v: text contains a NUL byte`
	want["sj"] = `convert value of ` + db + `.sj.j: JSON string contains a NUL byte`
	f.waitQuarantined(t, d, db, "stream", want)
	f.waitCaughtUp(t, db, d)
	f.compareTable(t, db, "ok")
	f.stopOK(t, d)
}

// waitQuarantined waits for each table of want to be quarantined with a
// reason containing want[table], and fails if the daemon exited.
func (f *fixture) waitQuarantined(t *testing.T, d *daemonProc, db, step string, want map[string]string) {
	t.Helper()
	for tb, reason := range want {
		var mode, got string
		testenv.WaitFor(60*time.Second, func() bool {
			mode, got = f.tableState(t, db, db, tb)
			return mode == "quarantined" || d.exited()
		})
		if mode != "quarantined" || !strings.Contains(got, reason) {
			t.Fatalf("%s: %s: state %q reason %q, want quarantined with %q\n%s", step, tb, mode, got, reason, tail(d.stderr.String(), 20))
		}
	}
	if d.exited() {
		t.Fatalf("%s: the daemon exited:\n%s", step, tail(d.stderr.String(), 20))
	}
}

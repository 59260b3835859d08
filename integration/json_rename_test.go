package integration

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"tidemark"
	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// TestJSONColumnOfAnOlderLayoutAfterRename (nemesis seeds 694193061382 and
// 574095280397): the stream reaches a layout's first table map after the
// source has already renamed one of its JSON columns. MariaDB's JSON is a
// LONGTEXT with a json_valid check, which only information_schema tells,
// and information_schema describes the table as it is now (the renamed
// column), not as the older layout's rows were written. The older layout's
// JSON column must stay JSON (it was JSON when the rows were written) and
// the table must not be quarantined ("json → text cannot be followed
// losslessly"); the target then equals the source.
//
// The window is deterministic: the daemon is stopped (SIGSTOP) after it
// streamed the table's first layout, the source adds a column (a new
// layout), writes rows with it and renames the JSON column, and only then
// is the daemon resumed. MySQL has a real JSON type in the table map; the
// test runs there too.
func TestJSONColumnOfAnOlderLayoutAfterRename(t *testing.T) {
	eachSource(t, func(t *testing.T, f *fixture) {
		db, start := f.newSource(t, "it_jsonren_")
		f.exec(t, "CREATE DATABASE "+db, "USE "+db,
			"CREATE TABLE t (id INT PRIMARY KEY, j JSON, v INT)",
			`INSERT INTO t VALUES (1, '{"a": 1}', 1), (2, '[1, 2]', 2)`)
		cfg := f.daemon(db, db, db, "UTC", start, "").Write(t)
		ps := &procSet{f: f, t: t}
		defer ps.killAll()
		dp := ps.start("run", "--config", cfg)
		spec := harness.TableSpec{Database: db, Table: "t", SourceZone: "UTC"}
		ps.converge(spec, "before the rename")
		if err := dp.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		resumed := false
		defer func() {
			if !resumed {
				_ = dp.cmd.Process.Signal(syscall.SIGCONT)
			}
		}()
		f.exec(t, "USE "+db,
			"ALTER TABLE t ADD COLUMN x INT",
			`INSERT INTO t VALUES (3, '{"b": 2}', 3, 3)`,
			`UPDATE t SET j = '{"a": 10}' WHERE id = 1`,
			"ALTER TABLE t RENAME COLUMN j TO k",
			`INSERT INTO t VALUES (4, '{"c": 3}', 4, 4)`)
		if err := dp.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		resumed = true
		// The stream passes the rename (row 4 is written after it).
		if !testenv.WaitFor(60*time.Second, func() bool {
			var n int
			err := f.pg.QueryRow(f.ctx, `SELECT count(*) FROM "`+db+`".t WHERE id = 4`).Scan(&n)
			return dp.exited() || (err == nil && n == 1) || strings.Contains(dp.stderr.String(), "quarantined")
		}) {
			t.Fatalf("the stream did not reach the row written after the rename:\n%s", tail(dp.stderr.String(), 20))
		}
		if mode, reason := f.tableState(t, db, db, "t"); mode == string(tidemark.TableQuarantined) {
			t.Fatalf("t quarantined: %s", reason)
		}
		if errs := grepLines(dp.stderr.String(), "level=ERROR"); strings.TrimSpace(errs) != "" {
			t.Fatalf("errors:\n%s", errs)
		}
		ps.converge(spec, "after the rename")
		var typ string
		if err := f.pg.QueryRow(f.ctx, "SELECT data_type FROM information_schema.columns WHERE table_schema = $1 AND table_name = 't' AND column_name = 'k'", db).Scan(&typ); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(typ, "json") {
			t.Errorf("target column k: type %s; want json or jsonb", typ)
		}
	})
}

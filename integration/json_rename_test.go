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

// jsonRenameSteps are what the source runs while the daemon is stopped or
// down: a new layout (x added), rows written with it, then the JSON
// column renamed, and a row after the rename.
var jsonRenameSteps = []string{
	"ALTER TABLE t ADD COLUMN x INT",
	`INSERT INTO t VALUES (3, '{"b": 2}', 3, 3)`,
	`UPDATE t SET j = '{"a": 10}' WHERE id = 1`,
	"ALTER TABLE t RENAME COLUMN j TO k",
	`INSERT INTO t VALUES (4, '{"c": 3}', 4, 4)`,
}

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
		f.exec(t, append([]string{"USE " + db}, jsonRenameSteps...)...)
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

// TestJSONColumnOfAnOlderLayoutAfterRestart (nemesis seed 574095280397):
// the same older layout as TestJSONColumnOfAnOlderLayoutAfterRename, but
// decoded by a process started after the rename, which never saw the JSON
// column listed in information_schema: the tailer is killed (kill -9)
// after it streamed the table's first layout, the source adds a column (a
// new layout), writes rows with it and renames the JSON column, and a new
// tailer resumes at the checkpoint before all of it. The tailer cannot
// know that the older layout's j was JSON; the sink knows (the target's
// alignment), and the table must not be quarantined ("json → text cannot
// be followed losslessly"); the target then equals the source, k stays
// jsonb. It runs the tailer into PostgreSQL (MariaDB, and MySQL, whose
// table map has a real JSON type), the fan-out (PostgreSQL and Kafka) and
// the apply topology (tailer → Kafka → applier → PostgreSQL).
func TestJSONColumnOfAnOlderLayoutAfterRestart(t *testing.T) {
	eachSource(t, func(t *testing.T, f *fixture) {
		db, start := f.newSource(t, "it_jsonrst_")
		f.exec(t, "CREATE DATABASE "+db)
		cfg := f.daemon(db, db, db, "UTC", start, "").Write(t)
		jsonAfterRestart(t, f, db, db, []string{"run", "--config", cfg}, nil, jsonRenameSteps)
	})
	t.Run("fanout", func(t *testing.T) {
		f := newFixture(t)
		r := f.newKafkaRun(t, "it_jsonrstf_", 105, "")
		jsonAfterRestart(t, f, r.db, r.db, []string{"run", "--config", r.cfg}, nil, jsonRenameSteps)
	})
	t.Run("apply", func(t *testing.T) {
		f := newFixture(t)
		r, _ := f.newApplyRun(t, "it_jsonrsta_", 106, 2, 50)
		jsonAfterRestart(t, f, r.db, r.db, []string{"run", "--config", r.cfg}, [][]string{{"apply", "--config", r.cfg}}, jsonRenameSteps)
	})
	// The seed's own shape: rows of the older layout, then DROP TABLE and
	// CREATE TABLE without j (ddl.drop_table: apply).
	t.Run("dropcreate", func(t *testing.T) {
		f := newFixture(t)
		db, start := f.newSource(t, "it_jsonrstd_")
		f.exec(t, "CREATE DATABASE "+db)
		d := f.daemon(db, db, db, "UTC", start, "")
		d.Target.Postgres.More = map[string]any{"ddl": map[string]any{"drop_table": "apply"}}
		jsonAfterRestart(t, f, db, db, []string{"run", "--config", d.Write(t)}, nil, []string{
			`INSERT INTO t VALUES (3, '{"b": 2}', 3)`,
			`UPDATE t SET j = '{"a": 10}' WHERE id = 1`,
			"DROP TABLE t",
			"CREATE TABLE t (id INT PRIMARY KEY, k JSON, v INT)",
			`INSERT INTO t VALUES (4, '{"c": 3}', 4)`,
		})
	})
}

// jsonAfterRestart runs TestJSONColumnOfAnOlderLayoutAfterRestart in
// database db (which exists) of source: table t is created, the tailer
// (tailerArgs) and the others (appliers) are started, the tailer is killed
// after the first layout converged, the source runs steps (which end with a
// row 4 and a column k, JSON), and a new tailer resumes.
func jsonAfterRestart(t *testing.T, f *fixture, source, db string, tailerArgs []string, others [][]string, steps []string) {
	t.Helper()
	f.exec(t, "USE "+db,
		"CREATE TABLE t (id INT PRIMARY KEY, j JSON, v INT)",
		`INSERT INTO t VALUES (1, '{"a": 1}', 1), (2, '[1, 2]', 2)`)
	ps := &procSet{f: f, t: t}
	defer ps.killAll()
	ps.start(tailerArgs...)
	for _, args := range others {
		ps.start(args...)
	}
	spec := harness.TableSpec{Database: db, Table: "t", SourceZone: "UTC"}
	ps.converge(spec, "before the kill")
	ps.procs[0].kill()
	f.exec(t, append([]string{"USE " + db}, steps...)...)
	ps.procs[0] = f.startCommand(t, tailerArgs)
	// The stream passes the rename (row 4 is written after it).
	quarantined := func() bool {
		for _, d := range ps.procs {
			if strings.Contains(d.stderr.String(), "quarantined") {
				return true
			}
		}
		return false
	}
	if !testenv.WaitFor(90*time.Second, func() bool {
		var n int
		err := f.pg.QueryRow(f.ctx, `SELECT count(*) FROM "`+db+`".t WHERE id = 4`).Scan(&n)
		return ps.procs[0].exited() || (err == nil && n == 1) || quarantined()
	}) {
		t.Fatalf("the stream did not reach the row written after the rename:\n%s", tail(ps.procs[0].stderr.String(), 20))
	}
	if mode, reason := f.tableState(t, source, db, "t"); mode == string(tidemark.TableQuarantined) {
		t.Fatalf("t quarantined: %s", reason)
	}
	for i, d := range ps.procs {
		if errs := grepLines(d.stderr.String(), "level=ERROR"); strings.TrimSpace(errs) != "" {
			t.Fatalf("process %d: errors:\n%s", i, errs)
		}
		if q := grepLines(d.stderr.String(), "quarantined"); strings.TrimSpace(q) != "" {
			t.Fatalf("process %d: a table quarantined:\n%s", i, q)
		}
	}
	ps.converge(spec, "after the restart")
	if f.flavor() != "mysql" {
		// The new tailer could not tell j from text; the sink resolved it.
		resolved := 0
		for _, d := range ps.procs {
			resolved += strings.Count(d.stderr.String(), "resolved from the target table")
		}
		if resolved == 0 || !strings.Contains(ps.procs[0].stderr.String(), "marked JSON-unknown") {
			t.Errorf("no column announced JSON-unknown and resolved by the sink:\n%s", tail(ps.procs[0].stderr.String(), 20))
		}
	}
	var typ string
	if err := f.pg.QueryRow(f.ctx, "SELECT data_type FROM information_schema.columns WHERE table_schema = $1 AND table_name = 't' AND column_name = 'k'", db).Scan(&typ); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(typ, "json") {
		t.Errorf("target column k: type %s; want json or jsonb", typ)
	}
}

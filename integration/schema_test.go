package integration

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"tidemark"
	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// Schema changes end to end (docs/schema-changes.md): ALTER TABLE while the
// daemon runs and in a backlog it reads after a restart, CREATE / DROP /
// RENAME / TRUNCATE of included tables, quarantine and resync, table and
// column filters, and the type round trip of generated columns, keyword
// names and latin1.

// schemaConfig is configYAMLWith plus lines for the source section and for
// target.postgres (e.g. "    drop_columns: drop").
func (f *fixture) schemaConfig(t *testing.T, source, db string, start tidemark.Position, sourceLines, pgLines, extra string) string {
	t.Helper()
	p := f.configYAMLWith(t, source, db, db, "UTC", start, extra)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	y := string(b)
	if sourceLines != "" {
		y = strings.Replace(y, "  heartbeat: 1s\n", "  heartbeat: 1s\n"+sourceLines, 1)
	}
	if pgLines != "" {
		y = strings.Replace(y, "    schema: "+db+"\n", "    schema: "+db+"\n"+pgLines, 1)
	}
	if err := os.WriteFile(p, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// forgetStates removes a test's table states and watermarks.
func (f *fixture) forgetStates(t *testing.T, sources ...string) {
	t.Cleanup(func() {
		for _, s := range sources {
			_, _ = f.pg.Exec(f.ctx, "DELETE FROM tidemark.tables WHERE source = $1", s)
			_, _ = f.pg.Exec(f.ctx, "DELETE FROM tidemark.watermarks WHERE source = $1", s)
		}
	})
}

func (f *fixture) exec(t *testing.T, sqls ...string) {
	t.Helper()
	if err := harness.Exec(f.my, sqls...); err != nil {
		t.Fatal(err)
	}
}

// pgColumns lists a target table's columns without the _tm_ metadata.
func (f *fixture) pgColumns(t *testing.T, schema, table string) string {
	t.Helper()
	return f.pgColumnsWhere(t, schema, table, "true")
}

// pgColumnsWhere is pgColumns of the columns that match cond (SQL over
// information_schema.columns).
func (f *fixture) pgColumnsWhere(t *testing.T, schema, table, cond string) string {
	t.Helper()
	rows, err := f.pg.Query(f.ctx, `SELECT column_name FROM information_schema.columns
		WHERE table_schema = $1 AND table_name = $2 AND column_name NOT LIKE '\_tm\_%' AND `+cond+` ORDER BY ordinal_position`, schema, table)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	return strings.Join(out, ",")
}

func (f *fixture) pgTableExists(t *testing.T, schema, table string) bool {
	t.Helper()
	var ok bool
	if err := f.pg.QueryRow(f.ctx, "SELECT to_regclass($1) IS NOT NULL", `"`+schema+`"."`+table+`"`).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

// tableState reads a table's recorded state ("" when there is none).
func (f *fixture) tableState(t *testing.T, source, db, table string) (mode, reason string) {
	t.Helper()
	var r *string
	err := f.pg.QueryRow(f.ctx, "SELECT state, reason FROM tidemark.tables WHERE source = $1 AND database = $2 AND table_name = $3", source, db, table).Scan(&mode, &r)
	if err != nil && !strings.Contains(err.Error(), "no rows") {
		t.Fatal(err)
	}
	if r != nil {
		reason = *r
	}
	return mode, reason
}

func (f *fixture) runResync(t *testing.T, config string, table string) (string, int) {
	t.Helper()
	cmd := exec.Command(binPath, "resync", "--config", config, "--table", table, "--wait", "2m")
	cmd.Env = append(cmd.Environ(), "TM_IT_MYSQL_PASSWORD="+f.env.MySQLPassword, "TM_IT_PG_DSN="+f.env.PGDSN)
	out, err := cmd.CombinedOutput()
	code := 0
	if err != nil {
		code = cmd.ProcessState.ExitCode()
	}
	return string(out), code
}

func (f *fixture) compareTable(t *testing.T, db, table string) {
	t.Helper()
	f.compare(t, harness.TableSpec{Database: db, Table: table, SourceZone: "UTC"})
}

// stopped records the daemons stopOK has waited for.
var stopped sync.Map

// cleanupDaemon kills *d unless stopOK stopped it.
func cleanupDaemon(d **daemonProc) {
	if _, ok := stopped.Load(*d); !ok {
		(*d).kill()
	}
}

func (f *fixture) stopOK(t *testing.T, d *daemonProc) {
	t.Helper()
	stopped.Store(d, true)
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit code %d; stderr:\n%s", code, d.stderr.String())
	}
}

// TestSchemaAlterWhileRunning: compatible ALTERs are followed in place
// (added column, widened types, a renamed column keeping its data); an ADD
// COLUMN with a default re-snapshots the table (existing rows got values the
// binlog does not show); a dropped column is kept in the target.
func TestSchemaAlterWhileRunning(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_alter_")
	f.dropLater(t, db, db)
	f.forgetStates(t, db)
	start, err := harness.SourcePosition(f.my)
	if err != nil {
		t.Fatal(err)
	}
	f.exec(t, "CREATE DATABASE "+db, "USE "+db,
		"CREATE TABLE t (id INT PRIMARY KEY, name VARCHAR(20), qty INT, price DECIMAL(8,2), st ENUM('new','paid'), f FLOAT, b BIT(4))",
		"INSERT INTO t SELECT seq, CONCAT('n', seq), seq * 10, seq + 0.25, IF(seq % 2, 'new', 'paid'), seq / 10, seq % 16 FROM seq_1_to_20")
	d := f.startDaemon(t, f.configYAML(t, db, db, db, "UTC", start))
	defer cleanupDaemon(&d)
	f.waitCaughtUp(t, db, d)
	f.compareTable(t, db, "t")

	f.exec(t,
		"ALTER TABLE t ADD COLUMN note VARCHAR(30)",
		"INSERT INTO t (id, name, note) VALUES (21, 'with note', 'hello')",
		"ALTER TABLE t MODIFY qty BIGINT, MODIFY price DECIMAL(12,3), MODIFY st VARCHAR(10), MODIFY f DOUBLE, MODIFY b BIT(8)",
		"UPDATE t SET qty = 5000000000, price = price + 1, b = 255 WHERE id <= 5",
		"ALTER TABLE t RENAME COLUMN name TO title",
		"UPDATE t SET title = CONCAT(title, '!') WHERE id BETWEEN 6 AND 8")
	f.waitCaughtUp(t, db, d)
	f.compareTable(t, db, "t") // rows 9..20 were never written after the rename: their titles came with the renamed column
	if cols := f.pgColumns(t, db, "t"); cols != "id,title,qty,price,st,f,b,note" {
		t.Fatalf("target columns %s", cols)
	}
	if strings.Contains(d.stderr.String(), "snapshotting table") {
		t.Fatalf("a compatible ALTER re-snapshotted the table:\n%s", grepLines(d.stderr.String(), "snapshot"))
	}

	// Existing rows get flag = 1 in the source without any row event.
	f.exec(t, "ALTER TABLE t ADD COLUMN flag INT NOT NULL DEFAULT 1",
		"INSERT INTO t (id, title, flag) VALUES (22, 'after', 2)")
	f.waitCaughtUp(t, db, d)
	f.compareTable(t, db, "t")
	if !regexpContains(d.stderr.String(), `snapshotting table.*reason="backfill after ALTER TABLE`) {
		t.Fatalf("no backfill snapshot:\n%s", grepLines(d.stderr.String(), "snapshot"))
	}

	f.exec(t, "ALTER TABLE t DROP COLUMN qty", "INSERT INTO t (id, title) VALUES (23, 'last')", "DELETE FROM t WHERE id = 2")
	f.waitCaughtUp(t, db, d)
	f.compareTable(t, db, "t")
	var kept, newRow *int64
	if err := f.pg.QueryRow(f.ctx, `SELECT (SELECT qty FROM "`+db+`".t WHERE id = 3), (SELECT qty FROM "`+db+`".t WHERE id = 23)`).Scan(&kept, &newRow); err != nil {
		t.Fatal(err)
	}
	if kept == nil || *kept != 5000000000 || newRow != nil {
		t.Fatalf("kept column qty: old row %v (want 5000000000), new row %v (want NULL)", kept, newRow)
	}
	if !strings.Contains(d.stderr.String(), "following a schema change") {
		t.Fatal("no log line for the schema changes")
	}
	f.stopOK(t, d)
}

// TestSchemaAlterWhileStoppedWithBacklog: tidemark is stopped; a column is
// added, rows written, columns reordered and dropped, rows written; on
// start the backlog is decoded with the columns each row was written with
// and the target ends equal to the source (drop_columns: drop).
func TestSchemaAlterWhileStoppedWithBacklog(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_backlog_")
	f.dropLater(t, db, db)
	f.forgetStates(t, db)
	start, err := harness.SourcePosition(f.my)
	if err != nil {
		t.Fatal(err)
	}
	f.exec(t, "CREATE DATABASE "+db, "USE "+db,
		"CREATE TABLE t (id INT PRIMARY KEY, a INT, b VARCHAR(10))",
		"CREATE TABLE other (id INT PRIMARY KEY, v INT)",
		"INSERT INTO t SELECT seq, seq, CONCAT('b', seq) FROM seq_1_to_10",
		"INSERT INTO other VALUES (1, 1)")
	cfg := f.schemaConfig(t, db, db, start, "", "    drop_columns: drop\n", "")
	d := f.startDaemon(t, cfg)
	f.waitCaughtUp(t, db, d)
	f.stopOK(t, d)

	f.exec(t,
		"ALTER TABLE t ADD COLUMN c INT",
		"INSERT INTO t VALUES (11, 11, 'b11', 110), (12, 12, 'b12', 120)",
		"UPDATE t SET c = id * 100 WHERE id <= 3",
		"INSERT INTO other VALUES (2, 2)",
		"ALTER TABLE t MODIFY b VARCHAR(10) FIRST, DROP COLUMN a",
		"INSERT INTO t (b, id, c) VALUES ('b13', 13, 130)",
		"UPDATE t SET b = 'changed' WHERE id IN (1, 11, 13)",
		"DELETE FROM t WHERE id = 12",
		"UPDATE other SET v = 20 WHERE id = 2")
	d = f.startDaemon(t, cfg)
	defer cleanupDaemon(&d)
	f.waitCaughtUp(t, db, d)
	f.compareTable(t, db, "t")
	f.compareTable(t, db, "other")
	if cols := f.pgColumns(t, db, "t"); cols != "id,b,c" {
		t.Fatalf("target columns %s, want id,b,c (a dropped: drop_columns: drop)", cols)
	}
	if strings.Contains(d.stderr.String(), "snapshotting table") {
		t.Fatalf("the backlog was re-snapshotted instead of decoded:\n%s", grepLines(d.stderr.String(), "snapshot"))
	}
	f.stopOK(t, d)
}

// TestCreateAndDropTables: a table created while the daemon runs is
// streamed; one renamed into the include filter with its rows is
// snapshotted; TRUNCATE and DROP TABLE are applied (ddl: apply) or a DROP
// TABLE refused (default) quarantines the table and keeps its target.
func TestCreateAndDropTables(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_ddl_")
	outside := db + "_out"
	f.dropLater(t, db, db, db+"_r")
	f.forgetStates(t, db, db+"_r")
	t.Cleanup(func() { _, _ = f.my.Execute("DROP DATABASE IF EXISTS " + outside) })
	start, err := harness.SourcePosition(f.my)
	if err != nil {
		t.Fatal(err)
	}
	f.exec(t, "CREATE DATABASE "+db, "CREATE DATABASE "+outside, "USE "+db,
		"CREATE TABLE t1 (id INT PRIMARY KEY, v VARCHAR(10))",
		"CREATE TABLE t2 (id INT PRIMARY KEY, v VARCHAR(10))",
		"INSERT INTO t1 SELECT seq, 'x' FROM seq_1_to_5",
		"INSERT INTO t2 SELECT seq, 'y' FROM seq_1_to_5",
		"CREATE TABLE "+outside+".x (id INT PRIMARY KEY, v VARCHAR(10))",
		"INSERT INTO "+outside+".x SELECT seq, CONCAT('out', seq) FROM seq_1_to_7")
	cfg := f.schemaConfig(t, db, db, start, "", "    ddl: {drop_table: apply, truncate: apply}\n", "")
	d := f.startDaemon(t, cfg)
	defer cleanupDaemon(&d)
	f.waitCaughtUp(t, db, d)

	f.exec(t,
		"CREATE TABLE t3 (id INT PRIMARY KEY, `order` INT)",
		"INSERT INTO t3 SELECT seq, seq FROM seq_1_to_4",
		"CREATE TABLE t4 (id INT PRIMARY KEY)",
		"RENAME TABLE "+outside+".x TO "+db+".t5",
		"INSERT INTO t5 VALUES (8, 'streamed')",
		"TRUNCATE TABLE t2",
		"INSERT INTO t2 VALUES (100, 'after')",
		"DROP TABLE t1",
		"INSERT INTO t4 VALUES (1)")
	f.waitCaughtUp(t, db, d)
	for _, tbl := range []string{"t2", "t3", "t4", "t5"} {
		f.compareTable(t, db, tbl)
	}
	if f.pgTableExists(t, db, "t1") {
		t.Fatal("t1 was dropped in the source but not in the target (ddl.drop_table: apply)")
	}
	if mode, _ := f.tableState(t, db, db, "t1"); mode != "" {
		t.Fatalf("state of the dropped table: %q", mode)
	}
	log := d.stderr.String()
	if !regexpContains(log, `snapshotting table.*table=`+db+`\.t5`) || regexpContains(log, `snapshotting table.*table=`+db+`\.t[34]`) {
		t.Fatalf("want a snapshot of the renamed t5 only:\n%s", grepLines(log, "snapshot"))
	}
	f.stopOK(t, d)

	// The default refuses DROP TABLE: the table is quarantined, its target
	// kept as it was, and the other tables go on.
	src2 := db + "_r"
	start2, _ := harness.SourcePosition(f.my)
	cfg2 := f.schemaConfig(t, src2, db, start2, "", "", "")
	// A second source writing the same schema: its tables must exist
	// first (they do), and it streams from now.
	d2 := f.startDaemon(t, cfg2)
	defer cleanupDaemon(&d2)
	f.exec(t, "INSERT INTO t3 VALUES (10, 10)")
	f.waitCaughtUp(t, src2, d2)
	f.exec(t, "DROP TABLE t3", "INSERT INTO t2 VALUES (101, 'still')")
	f.waitCaughtUp(t, src2, d2)
	if mode, reason := f.tableState(t, src2, db, "t3"); mode != "quarantined" || !strings.Contains(reason, "DROP TABLE refused") {
		t.Fatalf("t3 after a refused DROP TABLE: %q %q", mode, reason)
	}
	var n int
	if err := f.pg.QueryRow(f.ctx, `SELECT count(*) FROM "`+db+`".t3`).Scan(&n); err != nil || n != 5 {
		t.Fatalf("target t3 should be kept with its 5 rows: %d %v", n, err)
	}
	f.compareTable(t, db, "t2")
	f.stopOK(t, d2)
}

// TestQuarantineAndResync: an incompatible change (a narrowed type, then a
// new primary key) quarantines that table — a clear log line, the state in
// tidemark.tables, tidemark_table_state in /metrics — while the other table
// goes on; the quarantine survives a restart; `tidemark resync` brings the
// table back, with the daemon running and with it stopped.
func TestQuarantineAndResync(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_quar_")
	f.dropLater(t, db, db)
	f.forgetStates(t, db)
	start, err := harness.SourcePosition(f.my)
	if err != nil {
		t.Fatal(err)
	}
	f.exec(t, "CREATE DATABASE "+db, "USE "+db,
		"CREATE TABLE t1 (id INT PRIMARY KEY, v INT)", "CREATE TABLE t2 (id INT PRIMARY KEY, v INT)",
		"INSERT INTO t1 SELECT seq, seq FROM seq_1_to_10", "INSERT INTO t2 SELECT seq, seq FROM seq_1_to_10")
	addr := freePort(t)
	cfg := f.schemaConfig(t, db, db, start, "", "", fmt.Sprintf("metrics:\n  listen: %s\n", addr))
	d := f.startDaemon(t, cfg)
	defer cleanupDaemon(&d)
	f.waitCaughtUp(t, db, d)

	f.exec(t, "ALTER TABLE t1 MODIFY v SMALLINT", "INSERT INTO t1 VALUES (100, 1)", "INSERT INTO t2 VALUES (100, 1)")
	f.waitCaughtUp(t, db, d) // the checkpoint moves on
	f.compareTable(t, db, "t2")
	mode, reason := f.tableState(t, db, db, "t1")
	if mode != "quarantined" || !strings.Contains(reason, `column "v": int(32 bits) → int(16 bits)`) {
		t.Fatalf("t1: state %q reason %q", mode, reason)
	}
	if !regexpContains(d.stderr.String(), `level=ERROR msg="table quarantined.*table=`+db+`\.t1`) {
		t.Fatalf("no error line for the quarantine:\n%s", d.stderr.String())
	}
	m := scrape(t, "http://"+addr+"/metrics", "tidemark_table_state")
	if m[`tidemark_table_state{state="quarantined",table="`+db+`.t1"}`] != 1 || m[`tidemark_table_state{state="streaming",table="`+db+`.t2"}`] != 1 {
		t.Fatalf("tidemark_table_state: %v", m)
	}
	diff, err := harness.Compare(f.ctx, f.my, f.pg, harness.TableSpec{Database: db, Table: "t1"})
	if err != nil || diff.Missing != 1 {
		t.Fatalf("quarantined t1 should miss exactly the row after the change: %v %v", diff, err)
	}

	// Quarantined across a restart.
	f.stopOK(t, d)
	f.exec(t, "INSERT INTO t1 VALUES (101, 2)", "INSERT INTO t2 VALUES (101, 2)")
	d = f.startDaemon(t, cfg)
	f.waitCaughtUp(t, db, d)
	f.compareTable(t, db, "t2")
	if mode, _ := f.tableState(t, db, db, "t1"); mode != "quarantined" {
		t.Fatalf("t1 after restart: %q", mode)
	}
	if !strings.Contains(d.stderr.String(), "table is quarantined") {
		t.Fatalf("no startup line for the quarantined table:\n%s", d.stderr.String())
	}

	// Resync with the daemon running: it performs it.
	out, code := f.runResync(t, cfg, db+".t1")
	if code != 0 || !strings.Contains(out, "resync requested from the running daemon") || !strings.Contains(out, "resynced") {
		t.Fatalf("resync: exit %d\n%s\ndaemon:\n%s", code, out, d.stderr.String())
	}
	f.compareTable(t, db, "t1")
	f.exec(t, "INSERT INTO t1 VALUES (102, 3)", "UPDATE t1 SET v = 7 WHERE id = 1")
	f.waitCaughtUp(t, db, d)
	f.compareTable(t, db, "t1")
	if mode, _ := f.tableState(t, db, db, "t1"); mode != "streaming" {
		t.Fatalf("t1 after resync: %q", mode)
	}

	// A new primary key: quarantined again; resync with the daemon
	// stopped (resync does it itself), with changes in between.
	f.exec(t, "ALTER TABLE t1 DROP PRIMARY KEY, ADD PRIMARY KEY (id, v)", "INSERT INTO t1 VALUES (1, 8)")
	f.waitCaughtUp(t, db, d)
	if mode, reason := f.tableState(t, db, db, "t1"); mode != "quarantined" || !strings.Contains(reason, "business key changed from (id) to (id, v)") {
		t.Fatalf("t1 after a key change: %q %q", mode, reason)
	}
	f.stopOK(t, d)
	f.exec(t, "INSERT INTO t1 VALUES (103, 4)")
	out, code = f.runResync(t, cfg, db+".t1")
	if code != 0 || strings.Contains(out, "requested from the running daemon") || !strings.Contains(out, "resynced") {
		t.Fatalf("resync without a daemon: exit %d\n%s", code, out)
	}
	f.exec(t, "INSERT INTO t1 VALUES (104, 5)", "DELETE FROM t1 WHERE id = 2")
	d = f.startDaemon(t, cfg)
	f.waitCaughtUp(t, db, d)
	f.compareTable(t, db, "t1")
	f.compareTable(t, db, "t2")
	f.stopOK(t, d)
}

// TestFiltersAndColumnExclusion: include/exclude patterns and per-table
// column exclusion, on the first-run snapshot (SQL reads) and on the binlog:
// excluded tables and columns never reach the target (nor the log).
func TestFiltersAndColumnExclusion(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_filter_")
	view := db + "_v"
	f.dropLater(t, db, db)
	f.forgetStates(t, db)
	t.Cleanup(func() { _, _ = f.my.Execute("DROP DATABASE IF EXISTS " + view) })
	f.exec(t, "CREATE DATABASE "+db, "USE "+db,
		"CREATE TABLE users (id INT PRIMARY KEY, name VARCHAR(20), ssn VARCHAR(11), email VARCHAR(50))",
		"CREATE TABLE secret_keys (id INT PRIMARY KEY, k VARCHAR(20))",
		"CREATE TABLE plain (id INT PRIMARY KEY, v INT)",
		"CREATE TABLE nokey (a INT)", "INSERT INTO nokey VALUES (1)",
		"INSERT INTO users SELECT seq, CONCAT('user', seq), CONCAT('123-45-', LPAD(seq, 4, '0')), CONCAT('u', seq, '@secret.example') FROM seq_1_to_30",
		"INSERT INTO secret_keys VALUES (1, 'topsecret')",
		"INSERT INTO plain SELECT seq, seq FROM seq_1_to_5",
		// The verifier compares the source through a view of the columns
		// that are replicated.
		"CREATE DATABASE "+view, "CREATE VIEW "+view+".users AS SELECT id, name FROM "+db+".users")
	// No start position: the first run snapshots with SQL reads.
	cfg := f.schemaConfig(t, db, db, tidemark.Position{},
		fmt.Sprintf("  exclude: [\"%s.secret_*\"]\n  exclude_columns:\n    %s.users: [ssn, Email]\n", db, db), "", "")
	d := f.startDaemon(t, cfg)
	defer cleanupDaemon(&d)
	f.waitCaughtUp(t, db, d)
	f.exec(t, "INSERT INTO users VALUES (31, 'new', '999-99-9999', 'new@secret.example')",
		"UPDATE users SET ssn = '888-88-8888', email = 'x@secret.example', name = 'renamed' WHERE id = 1",
		"INSERT INTO secret_keys VALUES (2, 'topsecret2')", "INSERT INTO plain VALUES (6, 6)", "INSERT INTO nokey VALUES (2)")
	f.waitCaughtUp(t, db, d)
	f.compare(t, harness.TableSpec{Database: view, Table: "users", TargetSchema: db, Key: []string{"id"}, SourceZone: "UTC"})
	f.compareTable(t, db, "plain")
	if cols := f.pgColumns(t, db, "users"); cols != "id,name" {
		t.Fatalf("target users columns %s, want id,name", cols)
	}
	if f.pgTableExists(t, db, "secret_keys") {
		t.Fatal("an excluded table reached the target")
	}
	// A table the source cannot decode (no primary key) is quarantined by
	// the first-run snapshot; the rest goes on.
	if mode, reason := f.tableState(t, db, db, "nokey"); mode != "quarantined" || !strings.Contains(reason, "no primary key") {
		t.Fatalf("nokey: %q %q", mode, reason)
	}
	var leaked int
	if err := f.pg.QueryRow(f.ctx, `SELECT count(*) FROM "`+db+`".users u WHERE row_to_json(u)::text ~ '123-45|secret\.example|999-99|888-88'`).Scan(&leaked); err != nil || leaked != 0 {
		t.Fatalf("excluded values in the target: %d %v", leaked, err)
	}
	if log := d.stderr.String(); regexpContains(log, `123-45|secret\.example|999-99|topsecret`) {
		t.Fatalf("excluded values in the log:\n%s", log)
	}
	f.stopOK(t, d)
}

// TestTypeRoundTripSchemaEdges: generated columns (VIRTUAL and STORED),
// keyword table and column names, and a latin1 table round-trip through the
// first-run snapshot (SQL) and the binlog alike.
func TestTypeRoundTripSchemaEdges(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_edges_")
	f.dropLater(t, db, db)
	f.forgetStates(t, db)
	f.exec(t, "CREATE DATABASE "+db, "USE "+db, "SET NAMES utf8mb4",
		"CREATE TABLE g (id INT PRIMARY KEY, a INT, v INT AS (a * 2) VIRTUAL, s VARCHAR(20) AS (CONCAT('x', a)) STORED, `order` INT, `select` VARCHAR(5))",
		"CREATE TABLE `select` (`order` INT PRIMARY KEY, `from` VARCHAR(10), `where` DATETIME(3))",
		"CREATE TABLE l1 (`key` VARCHAR(10) PRIMARY KEY, txt VARCHAR(40), ch CHAR(3)) DEFAULT CHARSET=latin1",
		"INSERT INTO g (id, a, `order`, `select`) VALUES (1, 21, 7, 'x'), (2, NULL, NULL, NULL)",
		"INSERT INTO `select` VALUES (1, 'one', '2026-03-10 23:58:00.123'), (2, NULL, NULL)",
		"INSERT INTO l1 VALUES ('ü1', 'café € ‰ œ Ÿ', 'ÿé'), ('k2', NULL, '')")
	cfg := f.configYAML(t, db, db, db, "UTC", tidemark.Position{})
	d := f.startDaemon(t, cfg)
	defer cleanupDaemon(&d)
	f.waitCaughtUp(t, db, d)
	// The same kinds of rows again, through the binlog.
	f.exec(t, "SET NAMES utf8mb4",
		"INSERT INTO g (id, a, `order`, `select`) VALUES (3, -4, 8, 'y')", "UPDATE g SET a = 5 WHERE id = 1",
		"INSERT INTO `select` VALUES (3, 'three', '1999-12-31 23:59:59.999')", "UPDATE `select` SET `from` = 'uno' WHERE `order` = 1",
		"INSERT INTO l1 VALUES ('k3', 'Æble ø å €', 'ñ')", "UPDATE l1 SET txt = CONCAT(txt, ' ™') WHERE `key` = 'ü1'")
	f.waitCaughtUp(t, db, d)
	for _, tbl := range []string{"g", "select", "l1"} {
		f.compareTable(t, db, tbl)
	}
	// The verifier leaves generated columns out: check them here.
	r, err := f.my.Execute("SELECT GROUP_CONCAT(CONCAT_WS(':', id, COALESCE(v, 'N'), COALESCE(s, 'N')) ORDER BY id) FROM " + db + ".g")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := r.GetString(0, 0)
	var got string
	if err := f.pg.QueryRow(f.ctx, `SELECT string_agg(concat_ws(':', id, coalesce(v::text, 'N'), coalesce(s, 'N')), ',' ORDER BY id) FROM "`+db+`".g`).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != want || want == "" {
		t.Fatalf("generated columns: target %q, source %q", got, want)
	}
	f.stopOK(t, d)
}

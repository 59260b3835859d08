package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// The real MySQL 9.7 of scripts/services.sh: what a MySQL server writes that
// the protocol-level primary (integration/mysqlprimary) never produced.

// mysqlFeatureTables are created before the daemon starts (read by its
// snapshot) and written again while it streams.
var mysqlFeatureTables = []string{
	// native JSON edge values
	`CREATE TABLE js (id INT PRIMARY KEY, doc JSON)`,
	// a generated invisible primary key (my_row_id)
	`SET SESSION sql_generate_invisible_primary_key = ON`,
	`CREATE TABLE gipk (a INT NOT NULL, b VARCHAR(20))`,
	`SET SESSION sql_generate_invisible_primary_key = OFF`,
	// an INVISIBLE column and generated columns
	`CREATE TABLE inv (id INT PRIMARY KEY, v INT, secret VARCHAR(20) INVISIBLE)`,
	`CREATE TABLE gen (id INT PRIMARY KEY, a INT, b INT, s INT AS (a + b) STORED, p INT AS (a * b) VIRTUAL)`,
	// columns added and dropped with ALGORITHM=INSTANT
	`CREATE TABLE inst (id INT PRIMARY KEY, a INT, b VARCHAR(10))`,
	// renamed while streaming
	`CREATE TABLE ren1 (id INT PRIMARY KEY, v VARCHAR(10))`,
	// BIT(64), YEAR, TIME beyond a day and negative
	`CREATE TABLE tv (id INT PRIMARY KEY, b BIT(64), y YEAR, t TIME(6), t0 TIME)`,
	// the compressed transaction's table
	`CREATE TABLE big (id INT PRIMARY KEY, v VARCHAR(40))`,
}

func mysqlFeatureRows(base int) []string {
	b := func(i int) int { return base + i }
	return []string{
		fmt.Sprintf(`INSERT INTO js VALUES
			(%d, '[18446744073709551615, -9223372036854775808, 9007199254740993]'),
			(%d, JSON_OBJECT('price', CAST('12.50' AS DECIMAL(10,2)), 'huge', CAST('-12345678901234567890.123456789' AS DECIMAL(30,9)))),
			(%d, '[1.0, 0.1, 1e300, -2.5, 1e-7, 123456789012345680]'),
			(%d, JSON_ARRAY(CAST('2026-03-29 01:30:00.25' AS DATETIME(6)), CAST('1969-07-20' AS DATE), CAST('838:59:59' AS TIME))),
			(%d, CONCAT(REPEAT('[', 90), '{"n": 18446744073709551615}', REPEAT(']', 90))),
			(%d, JSON_OBJECT('s', REPEAT('é', 40000), 't', TRUE, 'a', NULL, 'e', '🐳', 'q', 'a"b\\c')),
			(%d, 'null'), (%d, '{}'), (%d, '""'), (%d, NULL)`,
			b(1), b(2), b(3), b(4), b(5), b(6), b(7), b(8), b(9), b(10)),
		fmt.Sprintf(`INSERT INTO gipk (a, b) VALUES (%d, 'one'), (%d, 'two'), (%d, 'three')`, b(1), b(2), b(3)),
		fmt.Sprintf(`UPDATE gipk SET b = 'two v2' WHERE a = %d`, b(2)),
		fmt.Sprintf(`DELETE FROM gipk WHERE a = %d`, b(3)),
		fmt.Sprintf(`INSERT INTO inv (id, v, secret) VALUES (%d, 1, 'hidden'), (%d, 2, NULL)`, b(1), b(2)),
		fmt.Sprintf(`UPDATE inv SET secret = 'changed' WHERE id = %d`, b(2)),
		fmt.Sprintf(`INSERT INTO gen (id, a, b) VALUES (%d, 2, 3), (%d, -1, 7)`, b(1), b(2)),
		fmt.Sprintf(`UPDATE gen SET a = 10 WHERE id = %d`, b(2)),
		fmt.Sprintf(`INSERT INTO inst VALUES (%d, 1, 'x'), (%d, 2, 'y')`, b(1), b(2)),
		fmt.Sprintf(`INSERT INTO ren1 VALUES (%d, 'a')`, b(1)),
		fmt.Sprintf(`INSERT INTO tv VALUES
			(%d, b'1111111111111111111111111111111111111111111111111111111111111111', 2155, '838:59:59.000000', '-838:59:59'),
			(%d, b'1000000000000000000000000000000000000000000000000000000000000001', 1901, '-00:00:00.000001', '25:00:00'),
			(%d, b'0', 0, '-100:30:15.5', '00:00:00')`, b(1), b(2), b(3)),
	}
}

// TestMySQLFeaturesIntoPostgres runs the tidemark binary against the real
// MySQL 9.7 into PostgreSQL: tables read by the first snapshot and then
// written through the binlog — native JSON edge values, a generated
// invisible primary key, an INVISIBLE column, STORED and VIRTUAL generated
// columns, ALGORITHM=INSTANT ADD and DROP COLUMN, RENAME TABLE, BIT(64),
// YEAR and TIME beyond ±24 h, a 100,000-row transaction written compressed
// (binlog_transaction_compression=ON), XA committed and rolled back — then a
// kill -9 and a restart resuming by GTID set. Every table is compared with
// the source row by row (harness.Compare, no code shared with tidemark).
func TestMySQLFeaturesIntoPostgres(t *testing.T) {
	f := newMySQLFixture(t)
	db := testenv.Name("it_myf_")
	f.dropLater(t, db, db)
	stmts := append([]string{"CREATE DATABASE " + db, "USE " + db}, mysqlFeatureTables...)
	stmts = append(stmts, mysqlFeatureRows(0)...)
	// big has a row, so the snapshot knows it and the 100,000-row
	// transaction arrives through the binlog
	stmts = append(stmts, "INSERT INTO big VALUES (0, 'first')")
	if err := harness.Exec(f.my, stmts...); err != nil {
		t.Fatal(err)
	}
	cfg := f.relConfig(t, db, db, relOpts{})
	d := f.startDaemon(t, cfg)
	f.caughtUpIn(t, db, d, 2*time.Minute)

	// Streamed: the same rows again, schema changes between them, a big
	// compressed transaction and XA.
	stream := append([]string{"USE " + db}, mysqlFeatureRows(100)...)
	stream = append(stream,
		"ALTER TABLE inst ADD COLUMN c VARCHAR(10) NOT NULL DEFAULT 'dflt', ALGORITHM=INSTANT",
		"INSERT INTO inst VALUES (201, 3, 'z', 'new')",
		"UPDATE inst SET a = a + 100 WHERE id IN (1, 101)",
		"ALTER TABLE inst DROP COLUMN b, ALGORITHM=INSTANT",
		"INSERT INTO inst VALUES (202, 4, 'after drop')",
		"UPDATE inst SET c = 'upd' WHERE id = 2",
		"DELETE FROM inst WHERE id = 102",
		"RENAME TABLE ren1 TO ren2",
		"INSERT INTO ren2 VALUES (200, 'renamed')",
		"UPDATE ren2 SET v = 'b' WHERE id = 1",
		"SET SESSION binlog_transaction_compression = ON",
		"SET SESSION cte_max_recursion_depth = 200000",
		"BEGIN",
		"INSERT INTO big WITH RECURSIVE s (n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < 100000) SELECT n, CONCAT('row ', n, ' ', REPEAT('z', 20)) FROM s",
		"UPDATE big SET v = 'updated' WHERE id % 1000 = 0",
		"COMMIT",
		"SET SESSION binlog_transaction_compression = OFF",
		"XA START 'tm-xa-ok'", "INSERT INTO ren2 VALUES (300, 'xa ok')", "XA END 'tm-xa-ok'", "XA PREPARE 'tm-xa-ok'",
		"XA START 'tm-xa-no'", "INSERT INTO ren2 VALUES (301, 'xa no')", "XA END 'tm-xa-no'", "XA PREPARE 'tm-xa-no'",
		"XA COMMIT 'tm-xa-ok'", "XA ROLLBACK 'tm-xa-no'",
	)
	compressed := compressedTxns(t, f)
	if err := harness.Exec(f.my, stream...); err != nil {
		t.Fatal(err)
	}
	f.caughtUpIn(t, db, d, 3*time.Minute)
	if log := d.stderr.String(); strings.Contains(log, "table="+db+".big reason=") {
		t.Fatalf("big was snapshotted again, not streamed:\n%s", grepLines(log, ".big"))
	}
	if n := compressedTxns(t, f); n <= compressed {
		t.Fatalf("the big transaction was not written compressed (binary_log_transaction_compression_stats: %d, %d before)", n, compressed)
	}
	check := func(when string) {
		t.Helper()
		for _, tbl := range []string{"js", "gipk", "inv", "gen", "inst", "ren2", "tv", "big"} {
			diff, err := harness.Compare(f.ctx, f.my, f.pg, harness.TableSpec{Database: db, Table: tbl})
			if err != nil {
				t.Fatalf("%s: %s: %v\n%s", when, tbl, err, grepLines(d.stderr.String(), "level=ERROR"))
			}
			if !diff.Equal() {
				t.Errorf("%s: %s: %s\n%s", when, tbl, diff, strings.Join(diff.Examples, "\n"))
			}
		}
	}
	check("streamed")
	if t.Failed() {
		t.Fatalf("daemon stderr:\n%s", tail(d.stderr.String(), 40))
	}
	// The generated columns' values in the target are MySQL's.
	var s, p int
	if err := f.pg.QueryRow(f.ctx, `SELECT s, p FROM "`+db+`".gen WHERE id = 102`).Scan(&s, &p); err != nil {
		t.Fatal(err)
	}
	if s != 17 || p != 70 {
		t.Fatalf("generated columns of gen 102: s=%d p=%d, want 17 and 70", s, p)
	}

	// kill -9 in the middle of more writes; the restart resumes by GTID set.
	if err := harness.Exec(f.my, "USE "+db, "INSERT INTO big WITH RECURSIVE s (n) AS (SELECT 100001 UNION ALL SELECT n + 1 FROM s WHERE n < 120000) SELECT n, 'second' FROM s"); err != nil {
		t.Fatal(err)
	}
	d.kill()
	if err := harness.Exec(f.my, "USE "+db, "DELETE FROM big WHERE id % 7 = 0", "INSERT INTO ren2 VALUES (400, 'while down')"); err != nil {
		t.Fatal(err)
	}
	d = f.startDaemon(t, cfg)
	f.caughtUpIn(t, db, d, 3*time.Minute)
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, d.stderr.String())
	}
	if log := d.stderr.String(); !strings.Contains(log, "resumed=true") {
		t.Fatalf("the restart did not resume:\n%s", tail(log, 40))
	}
	check("after kill -9 and restart")
}

// compressedTxns is how many transactions the server wrote compressed.
func compressedTxns(t *testing.T, f *fixture) int64 {
	t.Helper()
	r, err := f.my.Execute("SELECT COALESCE(SUM(TRANSACTION_COUNTER), 0) FROM performance_schema.binary_log_transaction_compression_stats WHERE LOG_TYPE = 'BINARY' AND COMPRESSION_TYPE = 'ZSTD'")
	if err != nil {
		t.Fatal(err)
	}
	n, _ := r.GetInt(0, 0)
	return n
}

// TestMySQLPartialRowImages: binlog_row_image and binlog_row_value_options
// are session variables, so one client can write partial row images
// (MINIMAL: an INSERT logs only the columns it names, an UPDATE only the key
// before and the changed columns after; PARTIAL_JSON: JSON diffs) while the
// global settings tidemark checks at start are FULL and ”. Such a row must
// never be applied as if it were whole: its table is quarantined with an
// error naming the setting, and the other tables go on.
func TestMySQLPartialRowImages(t *testing.T) {
	f := newMySQLFixture(t)
	db := testenv.Name("it_mypart_")
	f.dropLater(t, db, db)
	if err := harness.Exec(f.my, "CREATE DATABASE "+db, "USE "+db,
		"CREATE TABLE m (id INT PRIMARY KEY, a VARCHAR(20), b VARCHAR(20) DEFAULT 'dflt')", "INSERT INTO m VALUES (1, 'a', 'b'), (2, 'a', 'b')",
		"CREATE TABLE j (id INT PRIMARY KEY, doc JSON, note VARCHAR(20))", `INSERT INTO j VALUES (1, '{"a": 1, "b": [1, 2, 3]}', 'x')`,
		"CREATE TABLE ok (id INT PRIMARY KEY, v INT)"); err != nil {
		t.Fatal(err)
	}
	cfg := f.relConfig(t, db, db, relOpts{})
	d := f.startDaemon(t, cfg)
	defer d.kill()
	f.caughtUpIn(t, db, d, time.Minute)
	if err := harness.Exec(f.my, "USE "+db,
		"SET SESSION binlog_row_image = MINIMAL", "INSERT INTO m (id, a) VALUES (3, 'minimal')", "UPDATE m SET a = 'minimal' WHERE id = 1",
		"SET SESSION binlog_row_image = FULL",
		"SET SESSION binlog_row_value_options = PARTIAL_JSON", `UPDATE j SET doc = JSON_SET(doc, '$.a', 2) WHERE id = 1`,
		"SET SESSION binlog_row_value_options = ''",
		"INSERT INTO ok VALUES (1, 1)"); err != nil {
		t.Fatal(err)
	}
	f.caughtUpIn(t, db, d, time.Minute)
	log := d.stderr.String()
	var b *string
	err := f.pg.QueryRow(f.ctx, `SELECT b FROM "`+db+`".m WHERE id = 3`).Scan(&b)
	if err == nil {
		t.Fatalf("a MINIMAL row image was applied as a whole row (m.3.b = %s, the source has 'dflt'):\n%s", deref(b), tail(log, 20))
	}
	quarantined := func(table, why string) bool {
		for _, l := range strings.Split(log, "\n") {
			if strings.Contains(l, "table quarantined") && strings.Contains(l, "table="+db+"."+table+" ") && strings.Contains(l, why) {
				return true
			}
		}
		return false
	}
	if !quarantined("m", "binlog_row_image=MINIMAL") || !quarantined("j", "binlog_row_value_options=PARTIAL_JSON") {
		t.Fatalf("partial row images must quarantine m and j naming the session setting:\n%s", grepLines(log, "level=ERROR"))
	}
	if d.exited() {
		t.Fatalf("the other tables must go on:\n%s", tail(log, 20))
	}
	t.Logf("quarantined:\n%s", grepLines(log, "table quarantined"))
}

func deref(s *string) string {
	if s == nil {
		return "NULL"
	}
	return *s
}

// TestMySQLResetBinaryLogsWhileStopped: RESET BINARY LOGS AND GTIDS (MySQL
// 8.4's name for RESET MASTER) while tidemark is stopped empties
// gtid_executed and restarts the binlog at binlog.000001: the same server
// UUID then hands out the GTIDs of the checkpoint again, for other
// transactions. Resuming by GTID set would skip them silently once the
// server's set covers the checkpoint's; tidemark must stop instead, naming
// the reset, whether the new set is shorter or longer than the checkpoint.
func TestMySQLResetBinaryLogsWhileStopped(t *testing.T) {
	f := newMySQLFixture(t)
	db := testenv.Name("it_myreset_")
	f.dropLater(t, db, db)
	reset := func() {
		t.Helper()
		if err := harness.Exec(f.my, "RESET BINARY LOGS AND GTIDS"); err != nil {
			t.Fatal(err)
		}
	}
	reset()
	if err := harness.Exec(f.my, "CREATE DATABASE "+db, "USE "+db, "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20))"); err != nil {
		t.Fatal(err)
	}
	cfg := f.relConfig(t, db, db, relOpts{})
	d := f.startDaemon(t, cfg)
	for i := 1; i <= 5; i++ {
		if err := harness.Exec(f.my, fmt.Sprintf("INSERT INTO %s.t VALUES (%d, 'before')", db, i)); err != nil {
			t.Fatal(err)
		}
	}
	f.caughtUpIn(t, db, d, time.Minute)
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, d.stderr.String())
	}
	reset()
	// More transactions than the checkpoint holds: the server's GTID set
	// now covers the checkpoint's, with other transactions.
	for i := 100; i < 130; i++ {
		if err := harness.Exec(f.my, fmt.Sprintf("INSERT INTO %s.t VALUES (%d, 'after reset')", db, i)); err != nil {
			t.Fatal(err)
		}
	}
	d = f.startDaemon(t, cfg)
	exited := testenv.WaitFor(time.Minute, d.exited)
	log := d.stderr.String()
	var n int
	if err := f.pg.QueryRow(f.ctx, `SELECT count(*) FROM "`+db+`".t WHERE id >= 100`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if !exited {
		d.kill()
		if n < 30 {
			t.Fatalf("after RESET BINARY LOGS AND GTIDS tidemark kept running with %d of the 30 new rows (the others skipped as already seen):\n%s", n, tail(log, 20))
		}
		t.Fatalf("after RESET BINARY LOGS AND GTIDS tidemark kept running (it read the %d new rows, but resumed from a position that no longer means what it did):\n%s", n, tail(log, 20))
	}
	if n != 0 && n != 30 {
		t.Fatalf("stopped after applying %d of the 30 new rows", n)
	}
	t.Logf("stopped: %s", grepLines(log, "level=ERROR"))
}

// TestMySQLSpatialAndVectorRefused: spatial columns and MySQL 9's VECTOR
// have no mapping yet: their tables are quarantined with an error naming the
// column and its type, and the other tables go on.
func TestMySQLSpatialAndVectorRefused(t *testing.T) {
	f := newMySQLFixture(t)
	db := testenv.Name("it_mygeo_")
	f.dropLater(t, db, db)
	if err := harness.Exec(f.my, "CREATE DATABASE "+db, "USE "+db,
		"CREATE TABLE geo (id INT PRIMARY KEY, p POINT NOT NULL SRID 4326)", "INSERT INTO geo VALUES (1, ST_SRID(POINT(1, 2), 4326))",
		"CREATE TABLE vec (id INT PRIMARY KEY, v VECTOR(3))", "INSERT INTO vec VALUES (1, STRING_TO_VECTOR('[1.5, 2, 3]'))",
		"CREATE TABLE ok (id INT PRIMARY KEY)", "INSERT INTO ok VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	cfg := f.relConfig(t, db, db, relOpts{})
	d := f.startDaemon(t, cfg)
	defer d.kill()
	f.caughtUpIn(t, db, d, time.Minute)
	if err := harness.Exec(f.my, "USE "+db, "INSERT INTO geo VALUES (2, ST_SRID(POINT(3, 4), 4326))", "INSERT INTO vec VALUES (2, STRING_TO_VECTOR('[0, 0, 1]'))", "INSERT INTO ok VALUES (2)"); err != nil {
		t.Fatal(err)
	}
	f.caughtUpIn(t, db, d, time.Minute)
	log := d.stderr.String()
	for _, want := range [][2]string{{"geo", "point"}, {"vec", "vector"}} {
		ok := false
		for _, l := range strings.Split(log, "\n") {
			ok = ok || (strings.Contains(l, "quarantined") && strings.Contains(l, "table="+db+"."+want[0]+" ") && strings.Contains(strings.ToLower(l), want[1]))
		}
		if !ok {
			t.Errorf("%s: no quarantine naming its %s column:\n%s", want[0], want[1], grepLines(log, "level=ERROR"))
		}
	}
	diff, err := harness.Compare(f.ctx, f.my, f.pg, harness.TableSpec{Database: db, Table: "ok"})
	if err != nil || !diff.Equal() {
		t.Fatalf("the other table: %v %v", diff, err)
	}
	t.Logf("%s", grepLines(log, "quarantined"))
}

// TestMySQLCollationKeys: keys MySQL's collations treat as distinct (NO PAD
// utf8mb4_0900_ai_ci: 'a' and 'a ') or as equal (an update from 'a' to 'A'
// on a case-insensitive key; PAD SPACE utf8mb4_general_ci on a mirrored
// UNIQUE index) arrive in PostgreSQL, whose text keys compare bytes, with
// nothing rejected or merged; the streamed table equals the source and
// `tidemark verify` agrees.
func TestMySQLCollationKeys(t *testing.T) {
	f := newMySQLFixture(t)
	db := testenv.Name("it_mycoll_")
	f.dropLater(t, db, db)
	if err := harness.Exec(f.my, "CREATE DATABASE "+db, "USE "+db,
		"CREATE TABLE k (id VARCHAR(10) COLLATE utf8mb4_0900_ai_ci PRIMARY KEY, u VARCHAR(10) COLLATE utf8mb4_general_ci, v INT, UNIQUE KEY (u))",
		"INSERT INTO k VALUES ('a', 'x', 1), ('a ', 'y', 2), ('b', 'z', 3)"); err != nil {
		t.Fatal(err)
	}
	cfg := f.relConfig(t, db, db, relOpts{})
	d := f.startDaemon(t, cfg)
	defer d.kill()
	f.caughtUpIn(t, db, d, time.Minute)
	if err := harness.Exec(f.my, "USE "+db,
		"INSERT INTO k VALUES ('a  ', 'x ', 4)", // PAD SPACE: 'x ' equals 'x', a duplicate
	); err == nil {
		t.Fatal("PAD SPACE: 'x ' should collide with 'x' in the source")
	}
	if err := harness.Exec(f.my, "USE "+db,
		"INSERT INTO k VALUES ('a  ', 'w ', 4), ('é', 'É', 5)",
		"UPDATE k SET id = 'A' WHERE id = 'a'", // equal by the collation, other bytes
		"UPDATE k SET u = 'X' WHERE u = 'x'",
		"BEGIN", "UPDATE k SET u = 'tmp' WHERE id = 'b'", "UPDATE k SET u = 'z' WHERE id = 'a '", "UPDATE k SET u = 'Y' WHERE id = 'b'", "COMMIT",
		"DELETE FROM k WHERE id = 'A '", // equal to 'a ' (case-insensitive, same trailing space), not to 'A' (NO PAD)
	); err != nil {
		t.Fatal(err)
	}
	f.caughtUpIn(t, db, d, time.Minute)
	if log := d.stderr.String(); strings.Contains(log, "level=ERROR") {
		t.Fatalf("errors:\n%s", grepLines(log, "level=ERROR"))
	}
	diff, err := harness.Compare(f.ctx, f.my, f.pg, harness.TableSpec{Database: db, Table: "k"})
	if err != nil {
		t.Fatal(err)
	}
	if !diff.Equal() {
		t.Fatalf("target differs: %s\n%s", diff, strings.Join(diff.Examples, "\n"))
	}
	code, vout := runBinary(t, time.Minute, []string{"TM_IT_MYSQL_PASSWORD=" + f.env.MySQLPassword, "TM_IT_PG_DSN=" + f.env.PGDSN}, "verify", "--config", cfg)
	if code != 0 || !strings.Contains(vout, "verdict: EQUAL") {
		t.Fatalf("tidemark verify exit %d:\n%s", code, vout)
	}
	t.Logf("%s", diff)
}

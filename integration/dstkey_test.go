package integration

import (
	"testing"

	"tidemark"
	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// TestDSTGapKeyRefused (issue 22 / review finding 9): with source.time_zone
// America/New_York, '2026-03-08 02:30:00' is a local time the clocks
// skipped; the gap policy (later, the default) maps it to 07:30Z, the
// instant of '03:30:00'. In a key column two source rows would become one
// target row. A DATETIME key value in a gap quarantines the table, naming
// the column and the gap, on the snapshot path and on the binlog path (a
// primary key, a configured business key, a unique index); a DATETIME in
// no key or unique index keeps following the configured policy.
func TestDSTGapKeyRefused(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_dstkey_")
	f.dropLater(t, db, db)
	f.forgetStates(t, db)
	f.exec(t, "CREATE DATABASE "+db, "USE "+db,
		"CREATE TABLE snapk (sensor INT, ts DATETIME, v INT, PRIMARY KEY (sensor, ts))",
		"INSERT INTO snapk VALUES (1, '2026-03-08 01:30:00', 1), (1, '2026-03-08 02:30:00', 2), (1, '2026-03-08 03:30:00', 3)",
		"CREATE TABLE okk (sensor INT, ts DATETIME, v INT, PRIMARY KEY (sensor, ts))",
		"INSERT INTO okk VALUES (1, '2026-03-08 01:30:00', 1), (1, '2026-03-08 03:30:00', 3), (1, '2026-11-02 01:30:00', 4)",
		"CREATE TABLE snapu (id INT PRIMARY KEY, ts DATETIME, UNIQUE KEY u (ts))",
		"INSERT INTO snapu VALUES (1, '2026-03-08 02:30:00'), (2, '2026-03-08 03:30:00')",
		"CREATE TABLE nonkey (id INT PRIMARY KEY, ts DATETIME)",
		"INSERT INTO nonkey VALUES (1, '2026-03-08 02:30:00'), (2, '2026-03-08 03:30:00')")
	cfg := f.schemaConfig(t, db, db, tidemark.Position{}, "  business_keys:\n    "+db+".strb: [sensor, ts]\n", "", "")
	setYAML(t, cfg, "  time_zone: UTC\n", "  time_zone: America/New_York\n")
	d := f.startDaemon(t, cfg)
	defer cleanupDaemon(&d)
	want := map[string]string{
		"snapk": "convert value of " + db + ".snapk.ts: key column value 2026-03-08 02:30:00 is in a DST gap of America/New_York",
		"snapu": "convert value of " + db + ".snapu.ts: unique index column value 2026-03-08 02:30:00 is in a DST gap of America/New_York",
	}
	f.waitQuarantined(t, d, db, "snapshot", want)
	f.waitCaughtUp(t, db, d)
	spec := func(tb string) harness.TableSpec {
		return harness.TableSpec{Database: db, Table: tb, SourceZone: "America/New_York"}
	}
	f.compare(t, spec("okk"))
	var n int
	if err := f.pg.QueryRow(f.ctx, `SELECT count(DISTINCT ts) FROM "`+db+`".nonkey`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("nonkey: the gap policy (later) maps both values to one instant: %d distinct, %v", n, err)
	}

	// The binlog path.
	f.exec(t, "USE "+db,
		"CREATE TABLE strk (sensor INT, ts DATETIME(3), v INT, PRIMARY KEY (sensor, ts))",
		"CREATE TABLE strb (id INT AUTO_INCREMENT PRIMARY KEY, sensor INT NOT NULL, ts DATETIME NOT NULL, UNIQUE KEY (sensor, ts))",
		"INSERT INTO strk VALUES (1, '2026-03-08 01:59:59.999', 1), (1, '2026-03-08 03:00:00', 2)",
		"INSERT INTO strb (sensor, ts) VALUES (1, '2026-03-08 01:30:00')",
		"CREATE TABLE stru (id INT PRIMARY KEY, sensor INT, ts DATETIME, UNIQUE KEY u (sensor, ts))",
		"INSERT INTO stru VALUES (1, 1, '2026-03-08 03:30:00')",
		"INSERT INTO okk VALUES (2, '2026-03-09 02:30:00', 5)",
		"INSERT INTO stru VALUES (2, 1, '2026-03-08 02:30:00')",
		"INSERT INTO strk VALUES (1, '2026-03-08 02:00:00', 3)",
		"INSERT INTO strb (sensor, ts) VALUES (1, '2026-03-08 02:15:00'), (1, '2026-03-08 03:15:00')",
		"INSERT INTO okk VALUES (3, '2026-03-10 02:30:00', 6)")
	want["strk"] = "convert value of " + db + ".strk.ts: key column value 2026-03-08 02:00:00 is in a DST gap of America/New_York"
	want["stru"] = "convert value of " + db + ".stru.ts: unique index column value 2026-03-08 02:30:00 is in a DST gap of America/New_York"
	want["strb"] = "convert value of " + db + ".strb.ts: key column value 2026-03-08 02:15:00 is in a DST gap of America/New_York"
	f.waitQuarantined(t, d, db, "stream", want)
	f.waitCaughtUp(t, db, d)
	f.compare(t, spec("okk"))
	f.stopOK(t, d)
}

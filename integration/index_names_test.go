package integration

import (
	"strings"
	"testing"

	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// TestMirroredIndexNamesDoNotCollide: the mirror of table T's index I is
// named "T_I" (cut with a hash past 63 bytes), and index, constraint and
// table names share one namespace per PostgreSQL schema. Valid source
// schemas collide there: table a's index b_c and table a_b's index c are
// both a_b_c (and so are a 60-byte table's and its 62-byte sibling's, hash
// and all), table p's index q is the name of table p_q, and table u's
// unique index k (a constraint) that of table u_k. Before, the second
// CREATE INDEX failed ("relation "a_b_c" already exists", SQLSTATE 42P07)
// and the index named like a table made CREATE TABLE IF NOT EXISTS skip
// it ("target table has no column _tm_seq … it is not a tidemark table"):
// either stopped the daemon for every table. Now the later one takes its
// alternative name (a hash of the pair), a mirrored index in the way of a
// new table is renamed to it, and the names stay as they are after a
// restart (nothing is dropped or built again).
func TestMirroredIndexNamesDoNotCollide(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_ixnames_")
	f.dropLater(t, db, db)
	f.forgetStates(t, db)
	long := strings.Repeat("l", 60)
	tables := map[string]int{"a": 1, "a_b": 1, "p": 1, "p_q": 0, "u": 1, "u_k": 0, long: 1, long + "_b": 1}
	start, err := harness.SourcePosition(f.my)
	if err != nil {
		t.Fatal(err)
	}
	f.exec(t, "CREATE DATABASE "+db, "USE "+db,
		"CREATE TABLE a (id INT PRIMARY KEY, v INT, KEY b_c (v))",
		"CREATE TABLE a_b (id INT PRIMARY KEY, v INT, KEY c (v))",
		"CREATE TABLE p (id INT PRIMARY KEY, v INT, KEY q (v))",
		"CREATE TABLE u (id INT PRIMARY KEY, v INT, UNIQUE KEY k (v))",
		"CREATE TABLE "+long+" (id INT PRIMARY KEY, v INT, KEY b_c (v))",
		"CREATE TABLE "+long+"_b (id INT PRIMARY KEY, v INT, KEY c (v))")
	for tb := range tables {
		if tb != "p_q" && tb != "u_k" {
			f.exec(t, "INSERT INTO "+db+"."+tb+" SELECT seq, seq FROM seq_1_to_20")
		}
	}
	cfg := f.configYAML(t, db, db, db, "UTC", start)
	d := f.startDaemon(t, cfg)
	defer cleanupDaemon(&d)
	f.waitCaughtUp(t, db, d)
	// The tables named like the mirrors come after them.
	f.exec(t, "USE "+db,
		"CREATE TABLE p_q (id INT PRIMARY KEY, v INT)", "INSERT INTO p_q SELECT seq, seq FROM seq_1_to_20",
		"CREATE TABLE u_k (id INT PRIMARY KEY, v INT)", "INSERT INTO u_k SELECT seq, seq FROM seq_1_to_20",
		"INSERT INTO u VALUES (21, 21)", "INSERT INTO a VALUES (21, 21)")
	f.waitCaughtUp(t, db, d)
	check := func(when string) map[string]string {
		all := map[string]string{}
		for tb, want := range tables {
			f.compareTable(t, db, tb)
			ix := f.pgIndexes(t, db, tb)
			if len(ix) != want {
				t.Errorf("%s: %s has %d mirrored indexes, want %d: %v", when, tb, len(ix), want, ix)
			}
			for n, def := range ix {
				all[n] = def
			}
		}
		return all
	}
	before := check("first run")
	if t.Failed() {
		t.Fatalf("daemon log:\n%s", grepLines(d.stderr.String(), "index"))
	}
	f.stopOK(t, d)

	d = f.startDaemon(t, cfg)
	f.exec(t, "USE "+db, "INSERT INTO a_b VALUES (21, 21)", "INSERT INTO p VALUES (21, 21)", "ALTER TABLE u ADD COLUMN w INT", "INSERT INTO u VALUES (22, 22, 1)", "INSERT INTO u_k VALUES (21, 21)")
	f.waitCaughtUp(t, db, d)
	after := check("after a restart")
	if k1, k2 := keys(before), keys(after); k1 != k2 {
		t.Errorf("the mirrored indexes changed across a restart:\nbefore %s\nafter  %s", k1, k2)
	}
	if l := grepLines(d.stderr.String(), "DROP INDEX") + grepLines(d.stderr.String(), "DROP CONSTRAINT"); l != "" {
		t.Errorf("a restart dropped mirrored indexes:\n%s", l)
	}
	f.stopOK(t, d)
}

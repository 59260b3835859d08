package integration

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"tidemark/integration/harness"
)

// TestStartOverReplaysDropAndRenameOverNewerRows is the DROP TABLE and
// RENAME TABLE counterpart of TestStartOverReplaysTruncateOverNewerRows: a
// table dropped and created again with another layout (ddl.drop_table:
// apply), a gh-ost style cut-over (RENAME TABLE c TO c_old, c_new TO c),
// rows written and deleted after both (hard deletes), the tombstones
// pruned, then the checkpoint deleted and a restart from
// source.start_position, before all of it. The replayed DROP (and the
// rename's drop of c) drops the target table with the rows written after
// it, as it did when streamed; the table is then created again by the
// replayed CREATE with no tombstone horizon (tombstones.go: a table the
// sink creates has no history), so the replay of everything after the
// DROP fills it again: the tables end equal to the source. (Readers see
// the newer rows gone until the replay reaches them again: documented in
// docs/RELIABILITY.md, not fixed.)
func TestStartOverReplaysDropAndRenameOverNewerRows(t *testing.T) {
	f := newFixture(t)
	db, start := f.newSource(t, "it_replaydr_")
	if err := harness.Exec(f.my, "CREATE DATABASE "+db, "USE "+db,
		"CREATE TABLE d (id INT PRIMARY KEY, v INT)", "CREATE TABLE c (id INT PRIMARY KEY, v INT)",
		"CREATE TABLE u (id INT PRIMARY KEY, v INT)"); err != nil {
		t.Fatal(err)
	}
	cfg := f.relConfig(t, db, db, relOpts{Start: start, NoBatch: true, Extra: "batch:\n  max_delay: 50ms\n  max_changes: 20\n"})
	b, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	y, n := regexp.MustCompile(`(?m)^    dsn: .*\n`).ReplaceAllString(string(b), "${0}    ddl: {drop_table: apply}\n"), 0
	if n = strings.Count(y, "drop_table: apply"); n != 1 {
		t.Fatalf("ddl.drop_table set %d times in the config:\n%s", n, y)
	}
	if err := os.WriteFile(cfg, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	d := f.startDaemon(t, cfg)
	f.caughtUpIn(t, db, d, 2*time.Minute)
	for _, q := range []string{"INSERT INTO d SELECT seq, seq FROM seq_1_to_100", "INSERT INTO c SELECT seq, seq FROM seq_1_to_100",
		"DELETE FROM d WHERE id BETWEEN 91 AND 95",
		"DROP TABLE d", "CREATE TABLE d (id BIGINT PRIMARY KEY, w VARCHAR(20), v INT)",
		"INSERT INTO d SELECT seq, CONCAT('w', seq), seq FROM seq_101_to_200",
		"CREATE TABLE c_new (id INT PRIMARY KEY, v INT, x INT)", "INSERT INTO c_new SELECT id, v, id * 2 FROM c",
		"RENAME TABLE c TO c_old, c_new TO c",
		"INSERT INTO c SELECT seq, seq, seq FROM seq_101_to_150",
		"DELETE FROM d WHERE id BETWEEN 101 AND 110", "UPDATE d SET v = -v WHERE id > 190",
		"DELETE FROM c WHERE id BETWEEN 141 AND 150", "UPDATE c SET v = -v WHERE id <= 10"} {
		if err := harness.Exec(f.my, "USE "+db, q); err != nil {
			t.Fatal(err)
		}
	}
	f.caughtUpIn(t, db, d, 2*time.Minute)
	for _, tb := range []string{"d", "c", "c_old"} {
		f.compare(t, harness.TableSpec{Database: db, Table: tb})
	}
	f.pruneTombstones(t, db, d, pgx.Identifier{db, "d"}.Sanitize())
	f.pruneTombstones(t, db, d, pgx.Identifier{db, "c"}.Sanitize())
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d:\n%s", code, tail(d.stderr.String(), 20))
	}
	if _, err := f.pg.Exec(f.ctx, "DELETE FROM tidemark.checkpoints WHERE source = $1", db); err != nil {
		t.Fatal(err)
	}
	log := f.replayFromStart(t, db, cfg)
	if q := grepLines(log, "quarantined"); q != "" {
		t.Errorf("a table was quarantined replaying its history:\n%s", q)
	}
	f.compareReplayed(t, db, "d", "c", "c_old", "u")
	t.Logf("the replay's DROPs:\n%s", grepLines(log, "DROP TABLE"))
}

package main

import (
	"context"
	"log/slog"
	"sort"
	"strings"
	"testing"

	"tidemark"
	"tidemark/binlog"
	"tidemark/checkpoint"
	"tidemark/fallback"
	"tidemark/sink/postgres"
)

// keyDiffRun runs one catch-up of table with delete_detection: keydiff on
// the real servers (a source reader, the PostgreSQL sink) and returns its
// report.
func (e *e2e) keyDiffRun(table string, tc fallback.TableConfig, keyChunk int, mode string) fallback.TableReport {
	e.t.Helper()
	ctx := context.Background()
	bc, err := e.cfg.BinlogConfig()
	if err != nil {
		e.t.Fatal(err)
	}
	reader, err := binlog.NewReader(bc)
	if err != nil {
		e.t.Fatal(err)
	}
	defer reader.Close()
	store, err := checkpoint.New(checkpoint.Config{Schema: e.control})
	if err != nil {
		e.t.Fatal(err)
	}
	pc := e.cfg.PostgresSinkConfig()
	pc.Checkpoints, pc.Logger, pc.DeleteMode = store, slog.New(slog.DiscardHandler), postgres.DeleteMode(mode)
	sink, err := postgres.Open(ctx, pc)
	if err != nil {
		e.t.Fatal(err)
	}
	defer sink.Close()
	tc.DeleteDetection = fallback.DeletesKeyDiff
	id := tidemark.TableID{Database: e.db, Name: table}
	c, err := fallback.New(fallback.Config{Source: e.cfg.Source.Name, KeyChunkRows: keyChunk,
		Tables: map[string]fallback.TableConfig{id.String(): tc}}, reader, sink)
	if err != nil {
		e.t.Fatal(err)
	}
	rep, err := c.RunReport(ctx, []tidemark.TableID{id})
	if err != nil {
		e.t.Fatal(err)
	}
	return rep.Tables[0]
}

// bump commits an unrelated source transaction: a key diff's deletes carry
// the version captured before it reads (index 0 of the last transaction),
// which only a later transaction's rows are older than.
func (e *e2e) bump() {
	e.t.Helper()
	e.my1("USE "+e.db, "CREATE TABLE IF NOT EXISTS bump (id INT PRIMARY KEY AUTO_INCREMENT)", "INSERT INTO bump VALUES ()")
}

// targetKeys lists a target table's keys (k1[|k2]) that are not deleted.
func (e *e2e) targetKeys(table, cols, where string) []string {
	e.t.Helper()
	rows, err := e.pg.Query(context.Background(), `SELECT concat_ws(' / ', `+cols+`) FROM "`+e.db+`".`+table+` `+where)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			e.t.Fatal(err)
		}
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

// TestKeyDiffOrdersTextKeysByBytes: a PAD SPACE collation (utf8mb4_bin)
// sorts 'a\t' before 'a', PostgreSQL's "C" after: with chunks that small the
// two sides' chunks held different keys and the key diff deleted the live
// key 'a'. Every chunk size must leave every live key in place.
func TestKeyDiffOrdersTextKeysByBytes(t *testing.T) {
	e := newE2E(t)
	e.my1("USE "+e.db, "CREATE TABLE k (k VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY, v INT)",
		"INSERT INTO k VALUES ('a\\t', 1), ('a', 2), ('a\\n', 3), ('a\\tb', 4), ('b', 5), ('B', 6), ('é', 7), ('a\\t\\t', 8)")
	e.replicate()
	want := e.targetKeys("k", "k", "")
	if len(want) != 8 {
		t.Fatalf("replicated %d keys, want 8", len(want))
	}
	e.bump()
	for _, chunk := range []int{1, 2, 3, 5, 100} {
		tr := e.keyDiffRun("k", fallback.TableConfig{}, chunk, "")
		if got := e.targetKeys("k", "k", ""); tr.Deletes != 0 || strings.Join(got, ",") != strings.Join(want, ",") {
			t.Fatalf("key chunk %d: the key diff deleted %d live keys: target has %q, source %q", chunk, tr.Deletes, got, want)
		}
	}
	// A key gone from the source is still found, in every chunk size.
	e.my1("DELETE FROM k WHERE k = 'a'")
	tr := e.keyDiffRun("k", fallback.TableConfig{}, 2, "")
	if got := e.targetKeys("k", "k", ""); tr.Deletes != 1 || len(got) != 7 {
		t.Fatalf("deleted source key: the key diff deleted %d, target has %q", tr.Deletes, got)
	}
}

// TestKeyDiffHashIsUnambiguous: CONCAT_WS('|') gave ('a|b', 'c') and
// ('a', 'b|c') the same key hash, so a stale target row ('a', 'b|c') next to
// a missing ('a|b', 'c') summed like the source and survived the key diff.
// The window read does not re-read ('a|b', 'c') (its watermark is old), so
// only the key diff can find the stale row.
func TestKeyDiffHashIsUnambiguous(t *testing.T) {
	e := newE2E(t)
	e.my1("USE "+e.db, "CREATE TABLE c (k1 VARCHAR(20) NOT NULL, k2 VARCHAR(20) NOT NULL, ts DATETIME NOT NULL, PRIMARY KEY (k1, k2))",
		"INSERT INTO c VALUES ('a|b', 'c', '2020-01-01 00:00:00'), ('z', 'z', '2025-01-01 00:00:00')")
	e.replicate()
	tc := fallback.TableConfig{Column: "ts"}
	e.keyDiffRun("c", tc, 0, "") // stores the watermark
	e.pg1(`UPDATE "` + e.db + `".c SET k1 = 'a', k2 = 'b|c' WHERE k1 = 'a|b'`)
	e.bump()
	tr := e.keyDiffRun("c", tc, 0, "")
	if tr.Mode != "window" || tr.Rows != 1 {
		t.Fatalf("the second run read %d rows in mode %s, want 1 in window mode", tr.Rows, tr.Mode)
	}
	if got := e.targetKeys("c", "k1, k2", ""); tr.Deletes != 1 || strings.Join(got, ",") != "z / z" {
		t.Fatalf("the stale row ('a', 'b|c') survived the key diff (deleted %d): target has %q", tr.Deletes, got)
	}
}

// TestKeyDiffSoftDeleteKeepsLastImage: in soft-delete mode a row the key
// diff finds gone is marked deleted with its last values, not overwritten
// with NULLs (the key diff only knows the key).
func TestKeyDiffSoftDeleteKeepsLastImage(t *testing.T) {
	e := newE2E(t)
	e.cfg.Target.Postgres.DeleteMode = "soft"
	e.my1("USE "+e.db, "CREATE TABLE s (id INT PRIMARY KEY, name VARCHAR(20), amount DECIMAL(10,2) NOT NULL)",
		"INSERT INTO s VALUES (1, 'one', 1.50), (2, 'two', 2.50), (3, NULL, 3.50)")
	e.replicate()
	e.my1("DELETE FROM s WHERE id IN (2, 3)")
	tr := e.keyDiffRun("s", fallback.TableConfig{}, 0, "soft")
	if tr.Deletes != 2 {
		t.Fatalf("key diff deleted %d rows, want 2", tr.Deletes)
	}
	got := e.targetKeys("s", "id, coalesce(name, 'NULL'), amount, _tm_deleted", "")
	if want := "1 / one / 1.50 / f,2 / two / 2.50 / t,3 / NULL / 3.50 / t"; strings.Join(got, ",") != want {
		t.Fatalf("soft-deleted rows lost their last image:\n got %q\nwant %q", got, want)
	}
	var deletedAt int
	if err := e.pg.QueryRow(context.Background(), `SELECT count(*) FROM "`+e.db+`".s WHERE _tm_deleted AND _tm_deleted_at IS NOT NULL`).Scan(&deletedAt); err != nil || deletedAt != 2 {
		t.Fatalf("_tm_deleted_at set on %d rows (%v), want 2", deletedAt, err)
	}
	// Running it again changes nothing.
	if tr := e.keyDiffRun("s", fallback.TableConfig{}, 0, "soft"); tr.Deletes != 0 {
		t.Fatalf("second run deleted %d rows again", tr.Deletes)
	}
}

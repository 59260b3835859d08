package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"tidemark"
)

// The primary key after a fresh load. A first run's snapshot of a table
// whose target held no rows (tidemark.Batch.FreshLoad) writes every row
// of the target table itself, all stamped with the run's one capture
// version. Maintaining the primary key's B-tree row by row during that
// COPY costs more than building it once over the loaded rows (a sorted
// build), so such a table is created without its primary key
// (alignment.KeyPending) and the rows go straight in with COPY (the direct
// path, forced: there is no arbiter for an upsert yet). The key is built:
//
//   - by MirrorIndexes after the load (the first run's end), before the
//     secondary indexes;
//   - by the ensure of any batch that is not a fresh load's rows (the
//     stream, a catch-up, a resync, a layout change mid-load), and by a
//     DDL event, before anything else touches the table: nothing but the
//     fresh load ever sees the table without its key.
//
// Doubles. A chunk applied again after a kill -9 (its progress was not
// recorded yet) or after a schema change restarted the read adds the same
// source rows a second time: same key, same version (the capture's). The
// key's build then fails with a unique violation; the doubles are removed
// — per key the row with the newest version, then the latest load time,
// is kept (the later read of the row, at least as new as the earlier;
// the stream from the capture replays every change after it either way)
// — and the key is built again. The count is logged. A table loaded
// without a restart has no doubles and takes the build alone.

const keySavepoint = "tm_key"

// buildKey adds the primary key of the alignment's business key to the
// target table qname that a fresh load created without one (t read in
// tx, a ddlTx), removing the doubles of replayed chunks first when there
// are any, and records the alignment without KeyPending; t is updated.
func (s *Sink) buildKey(ctx context.Context, tx pgx.Tx, id tidemark.TableID, qname string, t *targetTable) error {
	if t.align == nil || !t.align.KeyPending {
		return nil
	}
	if len(t.align.Key) == 0 {
		return fmt.Errorf("build the primary key of %s (source table %s): its alignment names no key columns", qname, id)
	}
	cols := make([]string, len(t.align.Key))
	for i, c := range t.align.Key {
		if _, ok := t.types[c]; !ok {
			return fmt.Errorf("build the primary key of %s (source table %s): key column %q is not in the table", qname, id, c)
		}
		cols[i] = tidemark.QuotePostgres(c)
	}
	keys := strings.Join(cols, ", ")
	add := "ALTER TABLE " + qname + " ADD PRIMARY KEY (" + keys + ")"
	if _, err := tx.Exec(ctx, "SAVEPOINT "+keySavepoint); err != nil {
		return fmt.Errorf("build the primary key of %s: %w", qname, err)
	}
	_, err := tx.Exec(ctx, add)
	var pgErr *pgconn.PgError
	if err != nil && errors.As(err, &pgErr) && pgErr.Code == "23505" {
		if _, rerr := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+keySavepoint); rerr != nil {
			return fmt.Errorf("build the primary key of %s: %w", qname, rerr)
		}
		q := tidemark.QuotePostgres
		dedupe := "DELETE FROM " + qname + " WHERE ctid IN (SELECT ctid FROM (SELECT ctid, row_number() OVER (PARTITION BY " + keys +
			" ORDER BY " + q(colSeq) + " DESC, " + q(colIdx) + " DESC, " + q(colLoadedAt) + " DESC, ctid DESC) AS n FROM " + qname + ") AS r WHERE n > 1)"
		tag, derr := tx.Exec(ctx, dedupe)
		if derr != nil {
			return fmt.Errorf("remove the doubled rows of %s before building its primary key: %w", qname, derr)
		}
		s.log.Info("removed the rows of a key loaded twice into a table loaded before its primary key (chunks applied again after a restart of the first-run snapshot, or business_keys values that repeat in the source, which an upsert would have merged too): one row per key kept, the newest read",
			"table", qname, "source_table", id.String(), "rows_removed", tag.RowsAffected())
		_, err = tx.Exec(ctx, add)
	}
	if err != nil {
		if cerr := constraintFailed(id, qname, err); cerr != nil {
			return cerr
		}
		return fmt.Errorf("build the primary key of %s: %w", qname, err)
	}
	if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT "+keySavepoint); err != nil {
		return fmt.Errorf("build the primary key of %s: %w", qname, err)
	}
	a := *t.align
	a.KeyPending = false
	if err := setAlignment(ctx, tx, qname, &a); err != nil {
		return fmt.Errorf("record the schema of %s: %w", qname, err)
	}
	s.log.Info("built the primary key of a table after its first load", "table", qname, "source_table", id.String(), "key", t.align.Key)
	t.align, t.key = &a, append([]string(nil), a.Key...)
	return nil
}

// freshFits reports whether a fresh load's layout d may go on writing into
// t, a table a fresh load created without its primary key: the same
// columns, kinds and key as the table is aligned to, each with the type
// the direct path's COPY encodes. Anything else (a layout changed mid-load)
// builds the key first and goes the usual way.
func freshFits(t *targetTable, d *tableDef) bool {
	if t.align == nil || !t.align.KeyPending || d.table.IndexesKnown {
		return false
	}
	want := alignmentOf(d.table)
	got := *t.align
	got.Seq, got.Idx, got.KeyPending = want.Seq, want.Idx, false
	return sameAlignment(&got, want) && directTypesMatch(t, d)
}

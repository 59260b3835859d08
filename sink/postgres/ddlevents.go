package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"

	"github.com/jackc/pgx/v5"

	"tidemark"
)

var _ tidemark.DDLSink = (*Sink)(nil)

// ApplyDDL implements tidemark.DDLSink: the events and the checkpoint in one
// transaction, under the DDL lock.
//
//   - TRUNCATE removes the target rows at its version or older (all of
//     them but those a replay finds written after it; ddl.truncate: apply)
//     or is refused (a *tidemark.TableError wrapping
//     tidemark.ErrDDLRefused).
//   - DROP TABLE drops the target table and forgets the table's state and
//     watermark (ddl.drop_table: apply), or is refused.
//   - ALTER TABLE renames target columns (their data stays), drops the
//     columns the source dropped (drop_columns: drop) or records them as
//     kept, and drops a kept column the source adds again (existing rows
//     have NULL there in the source). Types are followed when rows with
//     the new schema arrive.
//
// A TableError is never retried and nothing is committed; the pipeline
// quarantines the table and calls ApplyDDL again without it.
func (s *Sink) ApplyDDL(ctx context.Context, source string, events []tidemark.DDLEvent, checkpoint tidemark.Position) error {
	touched := map[tidemark.TableID]bool{}
	err := tidemark.Retry(ctx, "apply DDL of source "+source, s.cfg.Retry, retryable, s.rlog, func(ctx context.Context) error {
		return s.ddlTx(ctx, func(tx pgx.Tx) error {
			if err := s.fence(ctx, tx, source); err != nil {
				return err
			}
			for _, ev := range events {
				touched[ev.Table] = true
				if err := s.applyEvent(ctx, tx, source, ev); err != nil {
					return err
				}
			}
			if !checkpoint.IsZero() {
				return s.cfg.Checkpoints.SavePosition(ctx, querier{tx}, source, checkpoint)
			}
			return nil
		})
	})
	for id := range touched {
		s.forgetTable(id)
		if _, _, qname, err := s.targetOf(id); err == nil {
			// Read again when needed: a TRUNCATE raised the horizon.
			s.mu.Lock()
			delete(s.tombTop, qname)
			s.mu.Unlock()
		}
	}
	if err != nil {
		return redact(err, s.secret)
	}
	return nil
}

func (s *Sink) applyEvent(ctx context.Context, tx pgx.Tx, source string, ev tidemark.DDLEvent) error {
	policy := s.cfg.Schema
	_, _, qname, err := s.targetOf(ev.Table)
	if err != nil {
		return err // a *tidemark.TableError
	}
	refused := func(stmt, key string) error {
		return &tidemark.TableError{Table: ev.Table, Err: fmt.Errorf("%s refused by the configuration (ddl.%s: refuse); the target table %s is kept as it was: %w",
			stmt, key, qname, tidemark.ErrDDLRefused)}
	}
	var exists bool
	if err := tx.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", qname).Scan(&exists); err != nil {
		return fmt.Errorf("look up %s: %w", qname, err)
	}
	switch ev.Op {
	case tidemark.DDLTruncate:
		if !exists {
			return nil // nothing to keep or to truncate
		}
		if policy.Truncate != ApplyDDL {
			return refused("TRUNCATE", "truncate")
		}
		return s.truncateEvent(ctx, tx, qname, ev)
	case tidemark.DDLDropTable:
		// Refused only when there is a target table to keep: a table
		// created and dropped before any row reached the target (a
		// staging table, say) is simply forgotten.
		if exists && policy.DropTable != ApplyDDL {
			stmt := "DROP TABLE"
			if ev.Reason != "" {
				stmt += " (" + ev.Reason + ")"
			}
			return refused(stmt, "drop_table")
		}
		if exists {
			s.log.Info("dropping target table (source DROP TABLE)", "table", qname, "source_table", ev.Table.String(), "reason", ev.Reason)
			if _, err := tx.Exec(ctx, "DROP TABLE "+qname); err != nil {
				return fmt.Errorf("drop %s: %w", qname, err)
			}
		}
		if err := s.cfg.Checkpoints.DeleteTableState(ctx, querier{tx}, source, ev.Table); err != nil {
			return err
		}
		if err := s.cfg.Checkpoints.DeleteWatermark(ctx, querier{tx}, source, ev.Table); err != nil {
			return err
		}
	case tidemark.DDLAlterTable:
		if !exists {
			return nil
		}
		return s.alterEvent(ctx, tx, qname, ev)
	}
	return nil
}

// truncateEvent applies a source TRUNCATE at ev.Version to the target
// table qname. Streamed in order, it finds no target row newer than itself
// and the table is truncated. Replayed (the checkpoint deleted to start
// over, a start_position behind it; docs/FAILOVER.md), it meets the rows
// written after it: only the rows at its version or older are removed, as
// the apply members' TruncateBefore does. A plain TRUNCATE removed the newer
// rows too, and their replayed inserts were then skipped by the tombstone
// horizon (a change older than pruned deletes, of a key without a row):
// the rows never came back, nothing said (nemesis seed 75894702205).
//
// In hard-delete mode the TRUNCATE also raises the table's tombstone
// horizon (tombstones.go) to its version: the source table was empty
// there, so a change at or before it of a key without a row is older than
// the key's removal. A replayed insert from before the TRUNCATE is then
// skipped instead of coming back until the replay reaches the TRUNCATE.
func (s *Sink) truncateEvent(ctx context.Context, tx pgx.Tx, qname string, ev tidemark.DDLEvent) error {
	v := ev.Version
	if v == (tidemark.Version{}) {
		s.log.Info("truncating target table (source TRUNCATE)", "table", qname, "source_table", ev.Table.String())
		if _, err := tx.Exec(ctx, "TRUNCATE "+qname); err != nil {
			return fmt.Errorf("truncate %s: %w", qname, err)
		}
		return nil
	}
	if v.Seq > math.MaxInt64 || v.Index > math.MaxInt32 {
		return fmt.Errorf("truncate %s: version %s does not fit", qname, v)
	}
	seq, idx := int64(v.Seq), int32(v.Index)
	if h := s.cfg.horizonsName(); h != "" {
		if _, err := tx.Exec(ctx, "INSERT INTO "+h+" AS h (target, seq, idx) VALUES ($1, $2, $3)\n"+
			"ON CONFLICT (target) DO UPDATE SET seq = EXCLUDED.seq, idx = EXCLUDED.idx WHERE (h.seq, h.idx) < (EXCLUDED.seq, EXCLUDED.idx)",
			qname, seq, idx); err != nil {
			return fmt.Errorf("raise the tombstone horizon of %s to the TRUNCATE at %s: %w", qname, v, err)
		}
	}
	older := "(" + colSeq + ", " + colIdx + ") <= ($1, $2)"
	var newer bool
	if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM "+qname+" WHERE NOT "+older+")", seq, idx).Scan(&newer); err != nil {
		return fmt.Errorf("look for rows of %s newer than the TRUNCATE at %s: %w", qname, v, err)
	}
	if !newer {
		s.log.Info("truncating target table (source TRUNCATE)", "table", qname, "source_table", ev.Table.String(), "version", v.String())
		if _, err := tx.Exec(ctx, "TRUNCATE "+qname); err != nil {
			return fmt.Errorf("truncate %s: %w", qname, err)
		}
		return nil
	}
	tag, err := tx.Exec(ctx, "DELETE FROM "+qname+" WHERE "+older, seq, idx)
	if err != nil {
		return fmt.Errorf("delete rows of %s older than the TRUNCATE at %s: %w", qname, v, err)
	}
	s.log.Info("a replayed source TRUNCATE: removed the target rows older than it, kept the newer ones",
		"table", qname, "source_table", ev.Table.String(), "version", v.String(), "rows", tag.RowsAffected())
	return nil
}

// alterEvent applies what an ALTER TABLE event shows and a row schema
// cannot: renames, drops and re-adds.
func (s *Sink) alterEvent(ctx context.Context, tx pgx.Tx, qname string, ev tidemark.DDLEvent) error {
	t, err := readTarget(ctx, tx, qname)
	if err != nil {
		return fmt.Errorf("read the target schema of %s: %w", qname, err)
	}
	if !t.exists {
		return nil
	}
	// A fresh load's table takes its primary key before any DDL.
	if err := s.buildKey(ctx, tx, ev.Table, qname, t); err != nil {
		return err
	}
	q := tidemark.QuotePostgres
	a := t.align
	var before []byte
	var beforeAlign alignment
	if a != nil {
		before, _ = json.Marshal(a)
		_ = json.Unmarshal(before, &beforeAlign)
	}
	exec := func(stmt string) error {
		s.log.Info("following a schema change of the source", "table", qname, "source_table", ev.Table.String(), "ddl", stmt)
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("alter %s: %w", qname, err)
		}
		return nil
	}
	has := func(c string) bool { _, ok := t.types[c]; return ok }
	if a != nil && a.since() != (tidemark.Version{}) && ev.Version != (tidemark.Version{}) && ev.Version.Compare(a.since()) <= 0 {
		// History the table already holds: the stream replays the
		// table's ALTERs from before the layout it is aligned to (the
		// checkpoint deleted to start over, a start_position behind it;
		// docs/FAILOVER.md). Its renames, drops and re-adds are in the
		// table's columns already; applied again, a re-add dropped the
		// column with its values and a rename the renamed column, and
		// the replayed rows that carried the values lost to the rows'
		// newer versions (nemesis seed 219). The rows of the older
		// layouts are written into the table as it is (older.go).
		if len(ev.Renames) > 0 || len(ev.Dropped) > 0 || len(ev.Added) > 0 {
			s.log.Info("a replayed schema change older than the target table's schema: already followed, left alone",
				"table", qname, "source_table", ev.Table.String(), "ddl_version", ev.Version.String(), "table_version", a.since().String())
		}
		ev.Renames, ev.Dropped, ev.Added = nil, nil, nil
	}
	for _, r := range ev.Renames {
		if err := checkColumnName(r.To); err != nil {
			return &tidemark.TableError{Table: ev.Table, Err: fmt.Errorf("rename column %q: %w", r.From, err)}
		}
		if !has(r.From) {
			continue // already renamed (a replay), or never written
		}
		if has(r.To) {
			if a == nil || !slices.Contains(a.Kept, r.To) {
				return &tidemark.TableError{Table: ev.Table, Err: fmt.Errorf("rename column %q to %q: the target %s already has a column %q: %w",
					r.From, r.To, qname, r.To, tidemark.ErrIncompatibleSchema)}
			}
			if err := exec("ALTER TABLE " + qname + " DROP COLUMN " + q(r.To)); err != nil {
				return err
			}
			a.Kept = slices.DeleteFunc(a.Kept, func(s string) bool { return s == r.To })
		}
		if err := exec("ALTER TABLE " + qname + " RENAME COLUMN " + q(r.From) + " TO " + q(r.To)); err != nil {
			return err
		}
		t.types[r.To] = t.types[r.From]
		delete(t.types, r.From)
		if a != nil {
			for i := range a.Columns {
				if a.Columns[i].Name == r.From {
					a.Columns[i].Name = r.To
				}
			}
			for i := range a.Key {
				if a.Key[i] == r.From {
					a.Key[i] = r.To
				}
			}
			for i := range a.Kept {
				if a.Kept[i] == r.From {
					a.Kept[i] = r.To
				}
			}
		}
	}
	for _, c := range ev.Dropped {
		if !has(c) || slices.Contains(t.key, c) {
			continue
		}
		if a != nil {
			a.Columns = slices.DeleteFunc(a.Columns, func(x alignedColumn) bool { return x.Name == c })
		}
		if s.cfg.Schema.DropColumns == DropColumns {
			if err := exec("ALTER TABLE " + qname + " DROP COLUMN " + q(c)); err != nil {
				return err
			}
			delete(t.types, c)
			if a != nil {
				a.Kept = slices.DeleteFunc(a.Kept, func(s string) bool { return s == c })
			}
		} else {
			if a != nil && !slices.Contains(a.Kept, c) {
				a.Kept = append(a.Kept, c)
			}
			if t.notNull[c] {
				// Rows inserted from now on have no value for it.
				if err := exec("ALTER TABLE " + qname + " ALTER COLUMN " + q(c) + " DROP NOT NULL"); err != nil {
					return err
				}
			}
		}
	}
	for _, c := range ev.Added {
		if !has(c) || a == nil || !slices.Contains(a.Kept, c) {
			continue
		}
		// A kept column added again: its old values are not the source's
		// (NULL, or a default the backfill brings).
		if err := exec("ALTER TABLE " + qname + " DROP COLUMN " + q(c)); err != nil {
			return err
		}
		delete(t.types, c)
		a.Kept = slices.DeleteFunc(a.Kept, func(s string) bool { return s == c })
	}
	if a != nil && ev.IndexesRead && !s.cfg.SkipIndexes {
		// The indexes as the source has them after the statement.
		if _, err := s.mirrorTx(ctx, tx, ev.Table, qname, t, a, ev.Indexes, false); err != nil {
			return err
		}
	}
	if a != nil {
		slices.Sort(a.Kept)
		if ev.Version.Compare(a.since()) > 0 && !sameLayout(a, &beforeAlign) {
			// The layout the table is aligned to now begins here.
			a.Seq, a.Idx = ev.Version.Seq, ev.Version.Index
		}
		if after, _ := json.Marshal(a); string(after) == string(before) {
			return nil
		}
		if err := setAlignment(ctx, tx, qname, a); err != nil {
			return fmt.Errorf("record the schema of %s: %w", qname, err)
		}
	}
	return nil
}

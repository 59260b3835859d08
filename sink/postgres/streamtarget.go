package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"tidemark"
)

// TruncateBefore implements tidemark.StreamTarget: a source TRUNCATE at
// version v as an applier of one partition sees it. Every row of the
// table's target at v or older is removed (soft-delete mode: marked
// deleted and stamped with v), rows written after the TRUNCATE are kept.
// Each partition's applier runs it when it reaches the TRUNCATE's control
// record; it is idempotent, so the table converges whatever the order: a row
// that a lagging partition writes with an older version after the first run
// is removed again when that partition reaches its own control record.
// ddl.truncate: refuse refuses it like ApplyDDL (a *tidemark.TableError).
func (s *Sink) TruncateBefore(ctx context.Context, table tidemark.TableID, v tidemark.Version, commit time.Time) error {
	_, _, qname, err := s.targetOf(table)
	if err != nil {
		return &tidemark.TableError{Table: table, Err: err}
	}
	if s.cfg.Schema.Truncate != ApplyDDL {
		return &tidemark.TableError{Table: table, Err: fmt.Errorf("TRUNCATE refused by the configuration (ddl.truncate: refuse); the target table %s is kept as it was: %w", qname, tidemark.ErrDDLRefused)}
	}
	// At or before v: a snapshot at v saw only what came before the
	// TRUNCATE (tidemark.Version: a DDL event shares its version).
	q := "DELETE FROM " + qname + " WHERE (" + colSeq + ", " + colIdx + ") <= ($1, $2)"
	args := []any{int64(v.Seq), int64(v.Index)}
	var at any // _tm_deleted_at: the source commit time, NULL when unknown
	if !commit.IsZero() {
		at = commit
	}
	if s.cfg.DeleteMode == DeleteSoft {
		q = "UPDATE " + qname + " SET " + colDeleted + " = true, " + colDeletedAt + " = $3, " + colSeq + " = $1, " + colIdx + " = $2 WHERE (" +
			colSeq + ", " + colIdx + ") <= ($1, $2) AND NOT " + colDeleted
		args = append(args, at)
	}
	if _, err := s.execIfExists(ctx, "truncate "+qname+" before version "+v.String(), qname, q, args...); err != nil {
		return err
	}
	s.log.Info("truncated target rows older than a source TRUNCATE", "table", qname, "version", v.String())
	return nil
}

// execIfExists runs q (what, in errors and retries) when the table qname
// exists and returns the rows it affected.
func (s *Sink) execIfExists(ctx context.Context, what, qname, q string, args ...any) (int64, error) {
	var n int64
	err := s.retry(ctx, what, func(ctx context.Context) error {
		n = 0
		var exists bool
		if err := s.pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", qname).Scan(&exists); err != nil {
			return redact(fmt.Errorf("look up %s: %w", qname, err), s.secret)
		}
		if !exists {
			return nil
		}
		tag, err := s.pool.Exec(ctx, q, args...)
		if isUndefinedTable(err) {
			return nil // dropped since to_regclass looked
		}
		n = tag.RowsAffected()
		return redact(err, s.secret)
	})
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	return n, nil
}

// RemoveBefore implements tidemark.StreamTarget: the end of a snapshot of
// table stamped v, as an applier of one partition sees it. Every target row
// older than v was not in the snapshot (its rows are at v) and is removed;
// in soft-delete mode it is marked deleted and keeps its version (a
// snapshot row at v of a lagging partition then still wins over it). A row
// at v or newer is a snapshot row or a change the snapshot did not see
// (tidemark.Snapshot: v is above everything the read saw), which another
// partition may already have applied: it stays. Idempotent, any order.
func (s *Sink) RemoveBefore(ctx context.Context, table tidemark.TableID, v tidemark.Version) (int64, error) {
	_, _, qname, err := s.targetOf(table)
	if err != nil {
		return 0, &tidemark.TableError{Table: table, Err: err}
	}
	// The snapshot's rows are at v (Batch.Refresh).
	cond := "(" + colSeq + ", " + colIdx + ") < ($1, $2)"
	q := "DELETE FROM " + qname + " WHERE " + cond
	if s.cfg.DeleteMode == DeleteSoft {
		q = "UPDATE " + qname + " SET " + colDeleted + " = true, " + colDeletedAt + " = NULL WHERE " + cond + " AND NOT " + colDeleted
	}
	n, err := s.execIfExists(ctx, "remove rows of "+qname+" older than snapshot "+v.String(), qname, q, int64(v.Seq), int64(v.Index))
	if err != nil {
		return 0, err
	}
	s.log.Info("removed target rows older than a snapshot (gone from the source)", "table", qname, "version", v.String(), "rows", n)
	return n, nil
}

// errTableGone says that a table dropped under DropBefore's transaction.
var errTableGone = errors.New("table dropped meanwhile")

// DropBefore implements tidemark.StreamTarget: a source DROP TABLE at
// version v as an applier of one partition sees it. Under the DDL lock and
// an exclusive lock of the target table, every row at v or older is removed
// (in soft-delete mode too: the direct path drops the whole table), and the
// table is dropped when no row is left. Rows of a table created again
// under the same name after the DROP are newer and keep it. Each
// partition's applier runs it when it reaches the DROP's control record;
// it is idempotent, so the table converges whatever the order.
// ddl.drop_table: refuse refuses it like ApplyDDL (a *tidemark.TableError),
// unless there is no target table to keep.
func (s *Sink) DropBefore(ctx context.Context, table tidemark.TableID, v tidemark.Version) error {
	_, _, qname, err := s.targetOf(table)
	if err != nil {
		return &tidemark.TableError{Table: table, Err: err}
	}
	var removed int64
	var dropped, exists bool
	err = s.retry(ctx, "drop "+qname+" before version "+v.String(), func(ctx context.Context) error {
		removed, dropped, exists = 0, false, false
		return s.ddlTx(ctx, func(tx pgx.Tx) error {
			if err := tx.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", qname).Scan(&exists); err != nil {
				return fmt.Errorf("look up %s: %w", qname, err)
			}
			if !exists || s.cfg.Schema.DropTable != ApplyDDL {
				return nil
			}
			if _, err := tx.Exec(ctx, "LOCK TABLE "+qname+" IN ACCESS EXCLUSIVE MODE"); err != nil {
				if isUndefinedTable(err) {
					// Another applier dropped it since to_regclass
					// looked (its catalog snapshot was older).
					return errTableGone
				}
				return fmt.Errorf("lock %s: %w", qname, err)
			}
			// At or before v, like TruncateBefore.
			tag, err := tx.Exec(ctx, "DELETE FROM "+qname+" WHERE ("+colSeq+", "+colIdx+") <= ($1, $2)", int64(v.Seq), int64(v.Index))
			if err != nil {
				return fmt.Errorf("delete rows of %s: %w", qname, err)
			}
			removed = tag.RowsAffected()
			var left bool
			if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM "+qname+")").Scan(&left); err != nil {
				return fmt.Errorf("count rows of %s: %w", qname, err)
			}
			if left {
				return nil
			}
			if _, err := tx.Exec(ctx, "DROP TABLE "+qname); err != nil {
				return fmt.Errorf("drop %s: %w", qname, err)
			}
			dropped = true
			return nil
		})
	})
	if errors.Is(err, errTableGone) {
		exists, err = false, nil
	}
	if err != nil {
		return fmt.Errorf("drop %s before version %s: %w", qname, v, err)
	}
	if exists && s.cfg.Schema.DropTable != ApplyDDL {
		return &tidemark.TableError{Table: table, Err: fmt.Errorf("DROP TABLE refused by the configuration (ddl.drop_table: refuse); the target table %s is kept as it was: %w", qname, tidemark.ErrDDLRefused)}
	}
	if dropped {
		s.forgetTable(table)
	}
	s.log.Info("dropped target rows older than a source DROP TABLE", "table", qname, "version", v.String(), "rows", removed, "table_dropped", dropped)
	return nil
}

package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"tidemark"
)

// The direct insert path. A batch's rows for a table that are all inserts
// (binlog inserts or snapshot reads) of keys the batch holds once usually
// name keys the target has never seen. For those the staged upsert — COPY
// into a temp table, then INSERT … SELECT … ON CONFLICT with the version
// guard — does twice the work of what the outcome needs: a COPY straight
// into the target. So the sink first tries that COPY inside a savepoint.
// The target's primary key is the business key (checked when the table is
// ensured), so a key that already exists makes the COPY fail with a unique
// violation; the sink then rolls back to the savepoint and stages the rows
// as always, where the version guard decides. Correctness never rests on
// the guess: a fresh key inserted directly is exactly what the upsert would
// have inserted (same values, version, commit time and load time).
//
// A conflict wastes one COPY, so after one the table stages its next
// batches (1, 2, 4, … up to maxDirectSkip) before trying again; a success
// resets that. Replays after a restart and catch-up windows over existing
// rows conflict once and then stage.

// maxDirectSkip bounds the batches a table stages after repeated conflicts.
const maxDirectSkip = 256

const directSavepoint = "tm_direct"

// directState is one target table's state of the direct path.
type directState struct {
	safe    bool // primary key = business key, checked immediately
	skip    int  // batches still to stage before the next try
	penalty int  // skip after the next conflict
	// keyless: the table has no primary key yet (a fresh load's,
	// keyafter.go): its rows take the direct path, always.
	keyless bool
}

// DirectInserts returns the rows inserted by the direct path and the
// attempts that found an existing key and were staged instead, since Open.
func (s *Sink) DirectInserts() (rows, conflicts int64) {
	return s.directRows.Load(), s.directConflicts.Load()
}

// setDirect records whether table k may take the direct path, and
// whether it has no primary key yet (keyafter.go).
func (s *Sink) setDirect(k defKey, safe, keyless bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.direct[k] = &directState{safe: safe, keyless: keyless}
}

// keyless reports whether table k had no primary key when it was last
// ensured (a fresh load's table, keyafter.go).
func (s *Sink) keyless(k defKey) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.direct[k]
	return st != nil && st.keyless
}

// forgetKeyless records that table id has its primary key: no layout of
// it takes the forced direct path any more, and a fresh load's ensure of
// it runs again.
func (s *Sink) forgetKeyless(id tidemark.TableID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.clearKeyless(id)
	for k := range s.ensured {
		if k.id == id && k.fresh {
			delete(s.ensured, k)
		}
	}
}

// tryDirect reports whether this batch's rows for table k should try the
// direct path, counting down a back-off.
func (s *Sink) tryDirect(k defKey) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.direct[k]
	if st == nil || !st.safe {
		return false
	}
	if st.skip > 0 {
		st.skip--
		return false
	}
	return true
}

// directOutcome records a direct attempt's outcome for table k.
func (s *Sink) directOutcome(k defKey, inserted bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.direct[k]
	if st == nil || !st.safe {
		return
	}
	if inserted {
		st.penalty = 0
		return
	}
	s.directConflicts.Add(1)
	st.penalty = min(max(2*st.penalty, 1), maxDirectSkip)
	st.skip = st.penalty
}

// copyDirect COPYs g's rows straight into the target table inside a
// savepoint. It returns false (and leaves the transaction as it was) when
// PostgreSQL refuses them: a key already exists, or anything else the staged
// path is then left to handle or report.
func (s *Sink) copyDirect(ctx context.Context, tx pgx.Tx, g *groupPlan, loadedAt time.Time) (bool, error) {
	d := g.def
	if _, err := tx.Exec(ctx, "SAVEPOINT "+directSavepoint); err != nil {
		return false, d.wrap("insert rows into", err)
	}
	tag, err := tx.Conn().PgConn().CopyFrom(ctx, g.rows.directStream(len(d.table.Columns), loadedAt, d.soft), d.directCopySQL)
	n := tag.RowsAffected()
	if err != nil {
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) {
			return false, d.wrap("insert rows into", err) // the connection: the whole attempt is retried
		}
		if _, rerr := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+directSavepoint); rerr != nil {
			return false, d.wrap("roll back the direct insert into", rerr)
		}
		if pgErr.Code == "23505" {
			s.log.Debug("direct insert found existing keys; staging", "table", d.display, "rows", len(g.rows.rows))
			return false, nil
		}
		if s.keyless(g.key) {
			// A fresh load's table without its primary key: staging
			// has no arbiter to upsert on, so the refusal is the
			// batch's error.
			return false, d.wrap("insert the rows of a fresh load into", err)
		}
		// Anything else the target refused (a column changed behind
		// tidemark's back, a value that does not fit): the rows are staged,
		// where casts and the usual errors apply, and the table stages
		// until it is checked again.
		s.log.Warn("direct insert refused; staging this table's inserts", "table", d.display, "err", redact(err, s.secret))
		s.setDirect(g.key, false, false)
		return false, nil
	}
	if n != int64(len(g.rows.rows)) {
		return false, fmt.Errorf("insert rows into %s: copied %d of %d rows", d.display, n, len(g.rows.rows))
	}
	if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT "+directSavepoint); err != nil {
		return false, d.wrap("insert rows into", err)
	}
	s.directRows.Add(n) // counted when the attempt's transaction may still fail: a measure of the path's use
	return true, nil
}

// clearKeyless ends the forced direct path of every layout of table id;
// called with s.mu held.
func (s *Sink) clearKeyless(id tidemark.TableID) {
	for k, st := range s.direct {
		if k.id == id {
			st.keyless = false
		}
	}
}

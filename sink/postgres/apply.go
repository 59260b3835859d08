package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"tidemark"
)

// Apply makes the batch's changes, its checkpoint (when not zero) and its
// watermarks durable in one PostgreSQL transaction.
//
// Guarantees:
//   - When Apply returns nil, everything is committed. When it returns an
//     error, nothing is, except when the error says the commit outcome is
//     unknown (the connection was lost during COMMIT and could not be
//     checked): replaying the batch from the stored checkpoint is then
//     safe.
//   - Idempotent: a change whose version is not newer than the target row's
//     is a no-op counted as Skipped, so a replayed batch is all Skipped.
//   - Hard deletes remove the row and keep its key and version in a
//     tombstone (tombstones.go), written in the same transaction: a replay
//     from an older checkpoint cannot bring a deleted row back, not even
//     briefly (an older insert or update loses to the tombstone, Skipped).
//     Tombstones are pruned once no replay can start before their delete.
//     Soft-delete mode keeps the row and its version instead.
//   - Transient errors (connection loss, 40001, 40P01, 57P0x, 53300) are
//     retried with Config.Retry, the whole transaction at a time. A COMMIT
//     that fails without an answer from the server is resolved by asking
//     PostgreSQL for the transaction's status (txid_status) on a new
//     connection, falling back to reading the checkpoint back; the batch is
//     replayed only if it did not commit.
//   - Inserted+Updated+Deleted+Skipped+Coalesced == len(b.Changes), or the
//     transaction is rolled back and the error wraps
//     tidemark.ErrStatsMismatch. An update that changes the key is counted
//     once, by what happened to its new key (or to its old key when a later
//     change of the batch superseded the new one).
//
// Bad input (an unknown op, a missing image, a value of the wrong Go type, a
// NULL key) is an error naming the table and column before anything is sent.
//
// A batch of an applier (with Offsets) whose target table another
// applier dropped meanwhile (a source DROP TABLE that its partition reached
// first, tidemark.StreamTarget.DropBefore) is applied again (up to
// droppedRetries times: each other partition's DROP record may drop the
// new, empty table once more): the table is created again for its older
// rows, which the lagging partition's own
// DROP control record removes later. Without Offsets a table dropped behind
// the sink's back stays an error.
func (s *Sink) Apply(ctx context.Context, b *tidemark.Batch) (tidemark.ApplyStats, error) {
	// Columns the source could not tell from JSON (jsonunknown.go).
	b, err := s.resolveBatch(ctx, b)
	if err != nil {
		return tidemark.ApplyStats{}, fmt.Errorf("apply batch of source %q: %w", b.Source, err)
	}
	var missing bool
	st, err := s.apply(ctx, b, &missing)
	// Each other partition's DROP record may drop the table again between
	// the creation and the rows (it finds the new table empty): a few
	// more attempts, as many as there can be such records in a row.
	for attempt := 0; missing && len(b.Offsets) > 0 && attempt < droppedRetries; attempt++ {
		s.log.Info("a target table of the batch was dropped by another applier (a source DROP TABLE); applying the batch again", "source", b.Source, "attempt", attempt+1)
		st, err = s.apply(ctx, b, &missing)
	}
	return st, err
}

// droppedRetries bounds Apply's attempts at an applier's batch whose table
// other appliers' DROP records keep dropping.
const droppedRetries = 8

// apply is Apply once; *missing is set when it failed because a target
// table or column was missing (its "ensured" mark is dropped).
func (s *Sink) apply(ctx context.Context, b *tidemark.Batch, missing *bool) (tidemark.ApplyStats, error) {
	*missing = false
	start := time.Now()
	what := fmt.Sprintf("apply batch of source %q", b.Source)
	p, err := s.plan(b)
	if err != nil {
		return tidemark.ApplyStats{}, fmt.Errorf("%s: %w", what, err)
	}
	if len(p.groups) == 0 && b.Checkpoint.IsZero() && len(b.Watermarks) == 0 && len(b.Offsets) == 0 {
		st := tidemark.ApplyStats{Coalesced: p.coalesced, Skipped: p.skipped}
		if st.Total() != len(b.Changes) {
			return tidemark.ApplyStats{}, fmt.Errorf("%s: %d changes, counted %+v: %w", what, len(b.Changes), st, tidemark.ErrStatsMismatch)
		}
		return st, nil
	}
	// Create or evolve the target tables (schema changes: evolve.go, ensure.go), each in
	// its own transaction, in batch order. A new schema that cannot be
	// followed is a *tidemark.TableError: the pipeline quarantines the
	// table.
	replan := false
	for _, g := range p.groups {
		load := g.nLoad > 0 && g.nLoad == len(g.rows.rows)
		fresh := b.FreshLoad && load && g.nInserts == len(g.rows.rows)
		if err := s.ensure(ctx, g.def, g.key, g.minVersion, load, fresh); err != nil {
			return tidemark.ApplyStats{}, fmt.Errorf("%s: %w", what, redact(err, s.secret))
		}
		replan = replan || s.projectionOf(g.key) != nil
	}
	if replan {
		// A layout turned out older than its target table's: its rows
		// leave out the columns the table lacks (older.go).
		if p, err = s.plan(b); err != nil {
			return tidemark.ApplyStats{}, fmt.Errorf("%s: %w", what, err)
		}
	}
	if p.heldDue, err = s.heldDue(ctx, b); err != nil {
		return tidemark.ApplyStats{}, fmt.Errorf("%s: %w", what, redact(err, s.secret))
	}
	var stats tidemark.ApplyStats
	err = tidemark.Retry(ctx, what, s.cfg.Retry, retryable, s.rlog, func(ctx context.Context) error {
		actx, cancel := context.WithTimeout(ctx, s.cfg.ApplyTimeout)
		defer cancel()
		st, err := s.applyOnce(actx, b, p)
		if err != nil && actx.Err() != nil && ctx.Err() == nil {
			err = fmt.Errorf("no answer within apply_timeout %s (a hung or half-open connection?): %w", s.cfg.ApplyTimeout, err)
		}
		if err != nil {
			return redact(err, s.secret)
		}
		stats = st
		return nil
	})
	if err != nil {
		var te *tidemark.TableError
		if errors.As(err, &te) && errors.Is(err, tidemark.ErrHeldConstraint) {
			s.dropHeld(te.Table) // quarantined by the caller
			return tidemark.ApplyStats{}, redact(err, s.secret)
		}
		*missing = s.forgetOnMissing(err, p)
		if cerr := applyConstraintFailed(err, p); cerr != nil {
			return tidemark.ApplyStats{}, redact(cerr, s.secret)
		}
		return tidemark.ApplyStats{}, redact(err, s.secret)
	}
	s.tombCommitted(b.Source, p.tombNext)
	for _, id := range p.heldBuilt {
		s.dropHeld(id)
		s.forgetTable(id)
	}
	s.log.Debug("applied batch", "source", b.Source, "changes", len(b.Changes),
		"inserted", stats.Inserted, "updated", stats.Updated, "deleted", stats.Deleted,
		"skipped", stats.Skipped, "coalesced", stats.Coalesced, "duration", time.Since(start))
	return stats, nil
}

// forgetOnMissing drops the "ensured" mark of the batch's tables when the
// error says a table or column is missing (dropped behind the sink's back),
// so that the next Apply checks them again and reports clearly.
func (s *Sink) forgetOnMissing(err error, p *batchPlan) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || (pgErr.Code != "42P01" && pgErr.Code != "42703") {
		return false
	}
	for _, g := range p.groups {
		// Every layout of the table: a projected layout's def is not
		// the one its rows came with (older.go).
		s.forgetTable(g.def.id)
	}
	return true
}

// applyOnce runs one attempt of the batch's transaction.
func (s *Sink) applyOnce(ctx context.Context, b *tidemark.Batch, p *batchPlan) (st tidemark.ApplyStats, err error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return st, fmt.Errorf("begin transaction: %w", redact(err, s.secret))
	}
	done := false
	defer func() {
		if !done {
			// A rollback error only means the connection is gone, which
			// rolls back too. It runs even when ctx is done, bounded.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
			_ = tx.Rollback(rctx)
			cancel()
		}
	}()
	// The transaction id lets an ambiguous COMMIT be resolved later with
	// txid_status. The transaction writes anyway, so assigning it now
	// costs nothing.
	var xid int64
	var now time.Time // the transaction's now(): _tm_loaded_at of direct inserts
	if err := tx.QueryRow(ctx, "SELECT txid_current(), now()").Scan(&xid, &now); err != nil {
		return st, fmt.Errorf("begin transaction: %w", err)
	}
	if len(p.heldDue) > 0 {
		if err := lockHeld(ctx, tx); err != nil {
			return st, err
		}
	}
	deletes := false
	for _, g := range p.groups {
		deletes = deletes || (g.def.tomb != "" && g.nDelete+g.nKeyGone > 0)
	}
	stamp, next, err := s.tombBegin(ctx, tx, b, deletes)
	if err != nil {
		return st, err
	}
	p.tombNext = next
	st.Coalesced, st.Skipped = p.coalesced, p.skipped
	for _, g := range p.groups {
		gs, err := s.applyGroup(ctx, tx, g, now, b.Source, stamp, b.Refresh, len(b.Offsets) > 0)
		if err != nil {
			return st, err
		}
		if next != nil && g.def.tomb != "" && g.nDelete+g.nKeyGone > 0 {
			next.tombWritten(stamp)
		}
		st.Add(gs)
	}
	if err := s.fence(ctx, tx, b.Source); err != nil {
		return st, err
	}
	p.heldBuilt = p.heldBuilt[:0]
	for _, id := range p.heldDue {
		done, err := s.buildHeld(ctx, tx, id, b.Source, b.Checkpoint)
		if err != nil {
			return st, err
		}
		if done {
			p.heldBuilt = append(p.heldBuilt, id)
		}
	}
	q := querier{tx}
	if !b.Checkpoint.IsZero() {
		if err := s.cfg.Checkpoints.SavePosition(ctx, q, b.Source, b.Checkpoint); err != nil {
			return st, err
		}
	}
	for _, w := range b.Watermarks {
		if err := s.cfg.Checkpoints.SaveWatermark(ctx, q, b.Source, w); err != nil {
			return st, err
		}
	}
	if len(b.Offsets) > 0 {
		for _, o := range b.Offsets {
			if err := s.cfg.Checkpoints.SaveOffset(ctx, q, o); err != nil {
				return st, err
			}
		}
	}
	if st.Total() != len(b.Changes) {
		return st, fmt.Errorf("%d changes, counted %+v (total %d); rolled back: %w", len(b.Changes), st, st.Total(), tidemark.ErrStatsMismatch)
	}
	if s.hookBeforeCommit != nil {
		if err := s.hookBeforeCommit(ctx, tx); err != nil {
			return st, err
		}
	}
	if s.hookCommit != nil {
		err = s.hookCommit(ctx, tx)
	} else {
		err = tx.Commit(ctx)
	}
	done = true
	if err == nil {
		return st, nil
	}
	if !commitMayHaveHappened(err) {
		return st, fmt.Errorf("commit: %w", err)
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		// Said now, not after the resolution below (which may wait as
		// long again on a hung network): the operator learns of the hang
		// within apply_timeout.
		s.log.Warn("no answer to COMMIT within apply_timeout (a hung or half-open connection?): asking PostgreSQL whether it committed",
			"source", b.Source, "apply_timeout", s.cfg.ApplyTimeout)
	}
	// Resolve with a fresh deadline: the attempt's may be what expired.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ApplyTimeout)
	defer cancel()
	committed, rerr := s.resolveCommit(rctx, xid, b)
	if rerr != nil {
		return st, &ambiguousCommitError{err: err, resolveErr: redact(rerr, s.secret)}
	}
	if committed {
		s.log.Info("commit failed on the client side but the transaction committed", "source", b.Source, "err", redact(err, s.secret))
		return st, nil
	}
	return st, &ambiguousCommitError{err: err}
}

// applyGroup stages one target table's rows and merges them; stamp is the
// generation of the tombstones it writes (tombstones.go). stream is set for
// an applier's batch (one that stores stream offsets).
func (s *Sink) applyGroup(ctx context.Context, tx pgx.Tx, g *groupPlan, now time.Time, source string, stamp int64, refresh, stream bool) (tidemark.ApplyStats, error) {
	var st tidemark.ApplyStats
	d := g.def
	// Rows newer than every tombstone of their table (streaming, as a
	// rule) cannot be replays of deleted keys: they take the direct path
	// and the upsert without the tombstone check. Others go through the
	// guarded upsert. The newest tombstone is cached per process, which
	// is only right when this process writes every tombstone: an applier
	// shares its tables with the other members of its group (a
	// key-changing UPDATE deletes the old key on another partition's
	// member), so its batches always take the guarded upsert.
	guarded := stream && d.tomb != ""
	if !guarded && d.tomb != "" && g.nUpsert > 0 {
		top, err := s.tombMax(ctx, tx, d)
		if err != nil {
			return st, err
		}
		guarded = g.minVersion.Compare(top) <= 0
	}
	if s.keyless(g.key) {
		// A fresh load's table, still without its primary key
		// (keyafter.go): only its fresh rows come here (any other
		// batch's ensure built the key), and only the direct path can
		// write them.
		if guarded || g.nInserts != len(g.rows.rows) {
			return st, fmt.Errorf("apply to %s: the table's primary key is built after its first load, and this batch's rows are not all inserts newer than every delete (%d of %d inserts): refusing to write them before the key exists",
				d.display, g.nInserts, len(g.rows.rows))
		}
		inserted, err := s.copyDirect(ctx, tx, g, now)
		if err != nil {
			return st, err
		}
		if inserted {
			st.Inserted = len(g.rows.rows)
			return st, nil
		}
		// A unique violation: the key was built meanwhile; staged.
	} else if !guarded && g.nInserts == len(g.rows.rows) && s.tryDirect(g.key) {
		inserted, err := s.copyDirect(ctx, tx, g, now)
		if err != nil {
			return st, err
		}
		s.directOutcome(g.key, inserted)
		if inserted {
			st.Inserted = len(g.rows.rows)
			return st, nil
		}
	}
	if _, err := tx.Exec(ctx, d.createStageSQL); err != nil {
		return st, d.wrap("create staging table for", err)
	}
	tag, err := tx.Conn().PgConn().CopyFrom(ctx, g.rows.stageStream(len(d.table.Columns)), d.stageCopySQL)
	if err != nil {
		return st, d.wrap("stage rows for", err)
	}
	if n := tag.RowsAffected(); n != int64(len(g.rows.rows)) {
		return st, fmt.Errorf("stage rows for %s: copied %d of %d rows", d.display, n, len(g.rows.rows))
	}
	if stream && d.keyLockSQL != "" {
		if _, err := tx.Exec(ctx, d.keyLockSQL, d.qname); err != nil {
			return st, d.wrap("lock the staged keys of", err)
		}
	}
	counted := g.nUpsert
	if d.soft {
		counted += g.nDelete
	}
	if counted > 0 {
		sql, args := d.upsertSQL, []any(nil)
		if refresh {
			sql = d.refreshSQL
		}
		if guarded {
			sql, args = d.upsertTombSQL, []any{d.qname}
			if refresh {
				sql = d.refreshTombSQL
			}
		}
		rows, err := tx.Query(ctx, sql, args...)
		if err != nil {
			return st, d.wrap("upsert into", err)
		}
		returned := 0
		for rows.Next() {
			var inserted, deleted bool
			if d.soft {
				err = rows.Scan(&inserted, &deleted)
			} else {
				err = rows.Scan(&inserted)
			}
			if err != nil {
				rows.Close()
				return st, d.wrap("upsert into", err)
			}
			returned++
			switch {
			case deleted:
				st.Deleted++
			case inserted:
				st.Inserted++
			default:
				st.Updated++
			}
		}
		if err := rows.Err(); err != nil {
			return st, d.wrap("upsert into", err)
		}
		st.Skipped += counted - returned
	}
	if g.nMark > 0 {
		tag, err := tx.Exec(ctx, d.markSQL)
		if err != nil {
			return st, d.wrap("mark deleted in", err)
		}
		st.Deleted += int(tag.RowsAffected())
		st.Skipped += g.nMark - int(tag.RowsAffected())
	}
	if d.soft && g.nKeyGone > 0 {
		if _, err := tx.Exec(ctx, d.keyGoneSQL); err != nil {
			return st, d.wrap("mark old keys deleted in", err)
		}
	}
	if !d.soft && g.nDelete+g.nKeyGone > 0 {
		rows, err := tx.Query(ctx, d.deleteSQL)
		if err != nil {
			return st, d.wrap("delete from", err)
		}
		deleted := 0
		for rows.Next() {
			var op string
			if err := rows.Scan(&op); err != nil {
				rows.Close()
				return st, d.wrap("delete from", err)
			}
			if op == opDelete {
				deleted++
			}
		}
		if err := rows.Err(); err != nil {
			return st, d.wrap("delete from", err)
		}
		st.Deleted += deleted
		st.Skipped += g.nDelete - deleted
		if d.tomb != "" {
			if _, err := tx.Exec(ctx, d.tombWriteSQL, d.qname, source, stamp); err != nil {
				return st, d.wrap("write delete tombstones of", err)
			}
			s.raiseTombMax(d, g.maxDelete)
		}
	}
	return st, nil
}

// resolveCommit finds out whether the transaction xid committed after its
// COMMIT failed without an answer. It asks PostgreSQL on a new connection
// (txid_status), waiting while the transaction is still in progress; when
// the status is no longer known it compares the stored checkpoint with the
// batch's. It keeps trying for resolveTimeout, also when ctx is already
// done: returning an error here means "outcome unknown".
func (s *Sink) resolveCommit(ctx context.Context, xid int64, b *tidemark.Batch) (bool, error) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resolveTimeout)
	defer cancel()
	backoff := tidemark.Backoff{Initial: 50 * time.Millisecond, Max: 2 * time.Second}
	for attempt := 1; ; attempt++ {
		var status *string
		err := s.pool.QueryRow(rctx, "SELECT txid_status($1)", xid).Scan(&status)
		if err == nil {
			switch {
			case status == nil:
				return s.checkpointCommitted(rctx, b)
			case *status == "committed":
				// Not proof on its own: after a crash, PostgreSQL hands
				// out again the transaction ids that were never made
				// durable, so "committed" may be another transaction
				// that reused our id. The stored checkpoint decides;
				// without one the outcome stays unknown and the batch
				// is replayed (the version guard makes that safe).
				if b.Checkpoint.IsZero() {
					return false, fmt.Errorf("transaction %d reports committed, but a batch without a checkpoint cannot confirm it is ours", xid)
				}
				return s.checkpointCommitted(rctx, b)
			case *status == "aborted":
				// Reliable: had ours committed, its id would have been
				// durable and never reused.
				return false, nil
			}
			err = fmt.Errorf("transaction %d is still %s", xid, *status)
		} else if isXidInFuture(err) {
			// The server restarted and never made our id durable: the
			// transaction did not commit.
			return false, nil
		} else if !retryable(err) {
			return false, fmt.Errorf("read status of transaction %d: %w", xid, err)
		}
		t := time.NewTimer(backoff.Delay(attempt))
		select {
		case <-rctx.Done():
			t.Stop()
			return false, fmt.Errorf("read status of transaction %d: %w", xid, err)
		case <-t.C:
		}
	}
}

// checkpointCommitted is the fallback of resolveCommit: the batch committed
// if the stored checkpoint equals its checkpoint. Without a checkpoint the
// batch is treated as not committed, and replaying it is safe.
func (s *Sink) checkpointCommitted(ctx context.Context, b *tidemark.Batch) (bool, error) {
	if b.Checkpoint.IsZero() {
		return false, nil
	}
	pos, ok, err := s.cfg.Checkpoints.LoadPosition(ctx, querier{s.pool}, b.Source)
	if err != nil {
		return false, err
	}
	return ok && pos == b.Checkpoint, nil
}

// isXidInFuture reports txid_status's "transaction ID … is in the future"
// (SQLSTATE 22023), which after a crash restart means the id was never
// made durable.
func isXidInFuture(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "22023" && strings.Contains(pgErr.Message, "in the future")
}

package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"tidemark"
	"tidemark/checkpoint"
)

// Built once the target is consistent (tidemark.IndexMirrorAfter).
//
// A load reads a table chunk by chunk, each chunk as the source holds it
// when it is read (a first run resumed after a kill reads its remaining
// ranges minutes after the rows it had copied; a chunked read is never one
// read view). Every row is stamped with the load's capture version and the
// stream replays every change after the capture over them, so the target
// ends exact — but only once the stream has applied past a position
// captured after the load's last read (the high watermark). Until then a
// row copied early whose source row was deleted or changed since keeps its
// old values beside rows read later: a state the source never had, which a
// unique check must not judge.
//
// So MirrorIndexesAfter records the unique constraints not built yet (a
// load dropped them, or created the table) in the table's alignment (UniqueAfter: the source, the high watermark, the
// statements, which the DDL events keep up to date meanwhile: mirrorTx) and
// the first batch of that source whose checkpoint is at or past the high
// watermark builds them in its own transaction, under the DDL lock. A
// violation then is a target row the source does not explain: the
// transaction rolls back and Apply returns the *tidemark.TableError (with
// tidemark.ErrHeldConstraint) that quarantines the table, loudly, even when
// the batch holds none of its changes. A kill -9 in between leaves the
// alignment as it was: a new process finds the held constraints in the
// target's comments at its first batch (heldRead) and builds them the same
// way (and every heldRescan: another process may have held some).

// heldUnique is a table whose unique constraints wait for the stream.
type heldUnique struct {
	source string
	after  tidemark.Position
}

// holdUnique remembers (u non-nil) or forgets (u nil) id's held unique
// constraints after MirrorIndexes committed.
func (s *Sink) holdUnique(id tidemark.TableID, u *uniqueAfter, after tidemark.Position) {
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	if u == nil {
		delete(s.held, id)
		return
	}
	s.held[id] = heldUnique{source: u.Source, after: after}
}

// dropHeld forgets id's held unique constraints (built, gone, or failed:
// the table is quarantined).
func (s *Sink) dropHeld(id tidemark.TableID) {
	s.heldMu.Lock()
	delete(s.held, id)
	s.heldMu.Unlock()
}

// heldRescan is how often readHeld reads the target's held records again:
// another process may have held some since (a resync or catch-up command
// run while no daemon ran, the previous active instance of a standby). A
// variable for tests.
var heldRescan = time.Minute

// readHeld reads the held unique constraints the target's alignments
// record (a process killed while they waited, another process's load), at
// the first batch and then every heldRescan.
func (s *Sink) readHeld(ctx context.Context) error {
	s.heldMu.Lock()
	done := !s.heldRead.IsZero() && time.Since(s.heldRead) < heldRescan
	s.heldMu.Unlock()
	if done {
		return nil
	}
	found := map[tidemark.TableID]heldUnique{}
	err := s.retry(ctx, "read the held unique constraints", func(ctx context.Context) error {
		clear(found)
		rows, err := s.pool.Query(ctx, `SELECT d.description FROM pg_description d JOIN pg_class c ON c.oid = d.objoid
WHERE d.classoid = 'pg_class'::regclass AND d.objsubid = 0 AND c.relkind IN ('r', 'p') AND d.description LIKE '%"unique_after":{%'`)
		if err != nil {
			return err
		}
		comments, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		for _, c := range comments {
			var a alignment
			if json.Unmarshal([]byte(c), &a) != nil || a.UniqueAfter == nil {
				continue
			}
			id, err := tidemark.ParseTableID(a.UniqueAfter.Table)
			if err != nil {
				continue
			}
			after, err := tidemark.ParsePosition(a.UniqueAfter.After)
			if err != nil {
				continue // judged (built now) when its table is built: never
			}
			found[id] = heldUnique{source: a.UniqueAfter.Source, after: after}
		}
		return nil
	})
	if err != nil {
		return err
	}
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	added := 0
	for id, h := range found {
		if _, ok := s.held[id]; !ok {
			s.held[id] = h
			added++
		}
	}
	s.heldRead = time.Now()
	if added > 0 {
		s.log.Info("unique constraints held since a load wait for the stream to pass its high watermark", "tables", added)
	}
	return nil
}

// heldDue returns the tables whose held unique constraints batch b (its
// checkpoint) is at or past.
func (s *Sink) heldDue(ctx context.Context, b *tidemark.Batch) ([]tidemark.TableID, error) {
	if b.Checkpoint.IsZero() {
		return nil, nil
	}
	if err := s.readHeld(ctx); err != nil {
		return nil, err
	}
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	var due []tidemark.TableID
	for id, h := range s.held {
		if h.source == b.Source && passed(b.Checkpoint, h.after) {
			due = append(due, id)
		}
	}
	slices.SortFunc(due, func(a, b tidemark.TableID) int {
		if a.String() < b.String() {
			return -1
		}
		if a.String() > b.String() {
			return 1
		}
		return 0
	})
	return due, nil
}

// passed reports whether checkpoint cp is at or past the high watermark.
// Positions that cannot be compared (another server's, after a failover)
// count as passed: the constraints are judged then rather than held for
// ever.
func passed(cp, after tidemark.Position) bool {
	c, err := cp.Compare(after)
	return err != nil || c >= 0
}

// lockHeld takes the DDL lock in a batch's transaction that builds held
// constraints (before any row: the order of ddlTx).
func lockHeld(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", checkpoint.DDLLockKey); err != nil {
		return fmt.Errorf("lock for DDL: %w", err)
	}
	return nil
}

// buildHeld builds id's held unique constraints in tx, a batch's
// transaction at checkpoint cp of source, after the batch's rows. It
// reports whether the table is done with (built, or no longer held). A
// violation is the *tidemark.TableError that quarantines the table.
func (s *Sink) buildHeld(ctx context.Context, tx pgx.Tx, id tidemark.TableID, source string, cp tidemark.Position) (bool, error) {
	_, _, qname, err := s.targetOf(id)
	if err != nil {
		return true, nil
	}
	t, err := readTarget(ctx, tx, qname)
	if err != nil {
		return false, fmt.Errorf("read the target schema of %s: %w", qname, err)
	}
	if !t.exists || t.align == nil || t.align.UniqueAfter == nil || !t.align.UniqueAfterLoad {
		return true, nil // dropped, or loaded again since (held anew at its end)
	}
	u := t.align.UniqueAfter
	if u.Source != source {
		return false, nil
	}
	if after, err := tidemark.ParsePosition(u.After); err == nil && !passed(cp, after) {
		return false, nil // a newer load's high watermark
	}
	// A table that is not streaming (a snapshot of it queued or under
	// way: a backfill after ALTER TABLE, a resync) has its changes
	// skipped until that snapshot, which loads the target again and
	// holds its own constraints: the stream has not brought the target
	// to the source, and judging it now would quarantine the table for
	// rows the stream's skipped deletes were to remove (nemesis seed 16,
	// a backfill queued behind another table's).
	if s.cfg.Checkpoints != nil {
		states, err := s.cfg.Checkpoints.LoadTableStates(ctx, querier{tx}, source)
		if err != nil {
			return false, fmt.Errorf("read the table states of %s: %w", source, err)
		}
		for _, st := range states {
			if st.Table == id && st.Mode != tidemark.TableStreaming {
				return false, nil
			}
		}
	}
	if err := s.setPendingNotNull(ctx, tx, id, qname, t); err != nil {
		var te *tidemark.TableError
		if errors.As(err, &te) {
			return false, &tidemark.TableError{Table: id, Err: fmt.Errorf("%w (%w: set at checkpoint %s, the load's high watermark %s)",
				te.Err, tidemark.ErrHeldConstraint, cp, u.After)}
		}
		return false, err
	}
	for _, name := range slices.Sorted(maps.Keys(u.Create)) {
		stmt := u.Create[name]
		s.log.Info("building a mirrored unique constraint a load dropped: the stream has applied past the load's high watermark",
			"table", qname, "source_table", id.String(), "after", u.After, "checkpoint", cp.String(), "ddl", stmt)
		if _, err := tx.Exec(ctx, stmt); err != nil {
			if cerr := constraintFailed(id, qname, err); cerr != nil {
				return false, &tidemark.TableError{Table: id, Err: fmt.Errorf("%w (%w: built at checkpoint %s, the load's high watermark %s)",
					cerr.(*tidemark.TableError).Err, tidemark.ErrHeldConstraint, cp, u.After)}
			}
			return false, fmt.Errorf("build the held unique constraints of %s: %w", qname, err)
		}
		if t.align.Indexes == nil {
			t.align.Indexes = map[string]string{}
		}
		t.align.Indexes[name] = stmt
	}
	t.align.UniqueAfterLoad = false
	t.align.UniqueAfter = nil
	if err := setAlignment(ctx, tx, qname, t.align); err != nil {
		return false, fmt.Errorf("record the indexes of %s: %w", qname, err)
	}
	return true, nil
}

// sameHeld reports whether two held records are the same.
func sameHeld(a, b *uniqueAfter) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

package tidemark

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Snapshots beside the stream (docs/SNAPSHOTS.md). With
// PipelineConfig.Chunks a table's snapshot (a table seen for the first
// time, a resync, an ALTER backfill, a table renamed into the stream) no
// longer runs inside the apply loop: the loop goes on applying every other
// table's changes, and the table's own, while the table is read one
// key-range chunk at a time in a goroutine of its own. Each chunk lands
// between two batches.
//
// Why no change is lost or doubled (the DBLog watermark argument, with the
// apply loop's order as the window):
//
//  1. When the job becomes active, the target table is dropped (nothing
//     of the table is applying then: the loop waits for the batch in
//     flight, and the table's changes were skipped until now), and from
//     then on every change of the table the loop takes is applied
//     (version-guarded) and its key recorded with its version.
//  2. Chunk k is read after a capture at version v_k (one capture stamps
//     the chunks read within besideRecapture after it): its rows reflect
//     at least every transaction before v_k (they may reflect later
//     ones). An older capture is as good: it only supersedes more rows.
//  3. When the chunk lands, a row whose key has a recorded change newer
//     than v_k is dropped: that change, a full row image or a delete, has
//     been or will be applied and carries the key's state from then on. A
//     kept row has no change newer than v_k taken before the chunk lands,
//     so every newer change of its key is applied after it and wins by
//     version; every older change loses to it by version (before or
//     after it lands). Without the drop, a row deleted after the read
//     could come back (the delete's tombstone may be pruned already).
//  4. Rows the chunk does not carry were deleted before the read; the
//     table was empty at step 1 and every change since is applied in
//     order, so nothing stays that the source does not hold.
//  5. The job ends (the table streams from the first chunk's version on,
//     skipping older changes) only once the last chunk landed and the
//     committed checkpoint has reached the position of the job's first
//     capture: every change older than the floor has then been applied.
//     Ending at the last chunk alone let the floor skip the older
//     changes the stream had not delivered yet (it lags behind the
//     capture), after earlier changes of the same keys had been applied
//     in step 1: a row deleted in the source stayed in the target, its
//     DELETE counted as skipped (TestBesideSnapshotWaitsForTheStream).
//     Until then the table's changes and DDL are handled as during the
//     read (applied; a schema change restarts the job).
//
// With a sink whose consumers apply the snapshot on their own (a
// SnapshotBoundary: Kafka in the fan-out and the scale-out tailer), the
// job publishes a begin boundary when it becomes active (step 1, instead
// of dropping their table), and an end boundary at the first chunk's
// version when it ends (step 5): each consumer then removes the rows older
// than it. Every chunk row and every change the consumers apply after the
// end is at least that version, so what it removes is what no chunk
// carried: rows gone from the source (docs/SNAPSHOTS.md "With Kafka",
// K1-K5).
//
// Recorded keys older than the chunk that landed are forgotten (they drop
// nothing of a later chunk, whose version is not older): the set holds
// the keys the table's changes touched during one chunk's read.
//
// After each chunk the cursor is stored in the table's state (Cursor,
// with Floor = the first chunk's version): a restart resumes the job after
// the last chunk that landed, applying the table's changes from the
// checkpoint on (step 1 without the drop: the rows already landed stay).
// A schema change of the table restarts its snapshot from the first chunk
// (logged); a DROP TABLE ends it; a purged binlog position (the catch-up
// leaves snapshotting tables out) restarts it.

// besideJob is one table's snapshot beside the stream. Its fields are
// guarded by besides.mu.
type besideJob struct {
	id     TableID
	reason string
	gen    uint64 // bumped when the job restarts: an older read is dropped
	// fresh: the target is dropped when the job becomes active (its
	// table's changes are skipped until then); false once it was, or
	// for a resumed job.
	fresh bool
	// ranges are the table's key ranges with their progress (nil: not
	// split yet, at the first round); each round reads the next chunk of
	// up to Chunks.Parallelism() of them at once.
	ranges []SnapshotRange
	floor  Version // the first chunk's version
	// keys are the table's changes the loop took since it applies them:
	// the newest version per key.
	keys    map[Key]Version
	rows    int64 // rows read by this process
	dropped int64 // rows of chunks dropped for a newer change
	chunks  int
	resumed bool
	started time.Time
	noCur   bool // the cursor cannot be stored (logged once)
	// snap is the capture the next chunk is stamped with, taken at
	// snapAt (zero: none yet); see besideRecapture.
	snap   Snapshot
	snapAt time.Time
	// until is the position of the first capture of this run of the job:
	// it ends once the committed checkpoint has reached it (step 5).
	// read: the last chunk landed.
	until Position
	read  bool
	// savedAt is when the ranges were last stored
	// (PipelineConfig.SnapshotProgressEvery).
	savedAt time.Time
}

// besideRecapture is how long one capture stamps the chunks read after it.
// Any capture before a read will do (the read sees everything before it);
// a newer one supersedes fewer rows and lets the recorded keys be
// forgotten sooner, at the cost of a capture (on MariaDB under writes, a
// scan of the binlog file up to the position).
const besideRecapture = time.Second

// besides is a pipeline's queue of snapshots beside the stream; the first
// job is the one being read. Safe for concurrent use.
type besides struct {
	mu   sync.Mutex
	jobs []*besideJob
	kick chan struct{} // wakes the apply loop (capacity 1)
}

func (b *besides) wake() {
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// find returns the job of a table, nil when none.
func (b *besides) find(id TableID) *besideJob {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, j := range b.jobs {
		if j.id == id {
			return j
		}
	}
	return nil
}

// first returns the job being read (or to read next), nil when none.
func (b *besides) first() *besideJob {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.jobs) == 0 {
		return nil
	}
	return b.jobs[0]
}

// record notes the keys of the changes of tables whose jobs apply their
// changes (step 1).
func (b *besides) record(changes []Change) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.jobs) == 0 {
		return
	}
	for i := range changes {
		c := &changes[i]
		for _, j := range b.jobs {
			if j.fresh || j.id != c.Table.ID {
				continue
			}
			note(j.keys, c.Key(), c.Version)
			if kb := c.KeyBefore(); kb != "" {
				note(j.keys, kb, c.Version)
			}
		}
	}
}

func note(keys map[Key]Version, k Key, v Version) {
	if old, ok := keys[k]; !ok || v.Compare(old) > 0 {
		keys[k] = v
	}
}

// remove ends a table's job (if any) and reports whether there was one.
func (p *Pipeline) removeBeside(id TableID) bool {
	b := &p.bg
	b.mu.Lock()
	found := false
	for i, j := range b.jobs {
		if j.id == id {
			b.jobs = append(b.jobs[:i], b.jobs[i+1:]...)
			found = true
			break
		}
	}
	b.mu.Unlock()
	p.tables.setApplying(id, false)
	return found
}

// queueBeside records a table as snapshotting and queues its snapshot
// beside the stream; ranges, when not nil, resume an interrupted one
// (floor: its first chunk's version). A table that has a job already
// restarts it from the first chunk.
func (p *Pipeline) queueBeside(ctx context.Context, id TableID, reason string, ranges []SnapshotRange, floor Version) error {
	b := &p.bg
	st := TableState{Table: id, Mode: TableSnapshotting, Reason: reason}
	if ranges != nil {
		enc, err := EncodeRanges(ranges)
		if err != nil {
			return err
		}
		st.Cursor, st.Floor = enc, floor
	}
	b.mu.Lock()
	var j *besideJob
	for _, have := range b.jobs {
		if have.id == id {
			j = have
		}
	}
	restart := j != nil
	if j == nil {
		j = &besideJob{id: id}
		b.jobs = append(b.jobs, j)
	}
	j.gen++
	j.reason, j.ranges, j.floor, j.fresh = reason, ranges, floor, ranges == nil
	j.rows, j.dropped, j.chunks, j.resumed, j.started = 0, 0, 0, ranges != nil, time.Now()
	j.keys = map[Key]Version{}
	j.snap, j.snapAt, j.savedAt = Snapshot{}, time.Time{}, time.Time{}
	j.until, j.read = Position{}, false
	b.mu.Unlock()
	p.tables.setApplying(id, ranges != nil)
	if err := p.setState(ctx, st); err != nil {
		return err
	}
	switch {
	case restart:
		p.cfg.Logger.Warn("restarting the snapshot of a table from its first chunk", "source", p.cfg.Source, "table", id.String(), "reason", reason)
	case ranges != nil:
		left := 0
		for _, r := range ranges {
			if !r.Done {
				left++
			}
		}
		p.cfg.Logger.Info("resuming an interrupted snapshot after its last chunk, beside the stream", "source", p.cfg.Source, "table", id.String(),
			"reason", reason, "floor", floor.String(), "ranges", len(ranges), "ranges_left", left)
	default:
		p.cfg.Logger.Info("snapshotting table beside the stream", "source", p.cfg.Source, "table", id.String(), "reason", reason)
	}
	b.wake()
	return nil
}

// restartBesides restarts every job from its first chunk (after a
// catch-up that left their tables out).
func (p *Pipeline) restartBesides(ctx context.Context, why string) error {
	p.bg.mu.Lock()
	var ids []TableID
	for _, j := range p.bg.jobs {
		ids = append(ids, j.id)
	}
	p.bg.mu.Unlock()
	for _, id := range ids {
		if err := p.queueBeside(ctx, id, why, nil, Version{}); err != nil {
			return err
		}
	}
	return nil
}

// besideRound is the result of one round of chunk reads: the next chunk
// of each of up to Chunks.Parallelism() ranges, read at once on readers of
// their own, all stamped with one capture.
type besideRound struct {
	job    *besideJob
	gen    uint64
	ranges []SnapshotRange // the job's ranges (split in this round when it had none)
	parts  []besidePart
	snap   Snapshot // the rows' stamp
	snapAt time.Time
	err    error
}

// besidePart is one range's chunk of a round.
type besidePart struct {
	rng  int // index in ranges
	rows []Change
	next []any
}

// driveBeside starts reading the next round of chunks of the first job
// when no read is outstanding. A fresh job first drops its target table
// and starts applying its table's changes (step 1).
func (a *applier) driveBeside() error {
	p := a.p
	if p.cfg.Chunks == nil || a.besideRes != nil || a.ctx.Err() != nil {
		return nil
	}
	j := p.bg.first()
	if j == nil {
		return nil
	}
	p.bg.mu.Lock()
	fresh, read := j.fresh, j.read
	p.bg.mu.Unlock()
	if read {
		return a.finishWhenCaughtUp(j)
	}
	if fresh {
		// Nothing of the table may be applying while its target is
		// dropped.
		if err := a.wait(); err != nil {
			return err
		}
		if err := p.reg.ResetTable(a.ctx, p.cfg.Source, j.id); err != nil {
			if a.ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("snapshot %s beside the stream: %w", j.id, err)
		}
		if bd, ok := p.reg.(SnapshotBoundary); ok {
			// Kafka's consumers (the appliers): the begin boundary
			// precedes every chunk and every change of the table
			// applied from now on (kafka step 1).
			if err := bd.BeginSnapshot(a.ctx, p.cfg.Source, j.id, j.reason); err != nil {
				if a.ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("snapshot %s beside the stream: begin: %w", j.id, err)
			}
		}
		p.bg.mu.Lock()
		j.fresh = false
		j.keys = map[Key]Version{}
		p.bg.mu.Unlock()
		p.tables.setApplying(j.id, true)
		// The changes in hand were taken before; they apply after
		// the drop, so they count as taken now.
		p.bg.record(a.batch.batch.Changes)
	}
	p.bg.mu.Lock()
	r := besideRound{job: j, gen: j.gen, snap: j.snap, snapAt: j.snapAt, ranges: slices.Clone(j.ranges)}
	id := j.id
	p.bg.mu.Unlock()
	ctx, cancel := context.WithCancel(a.ctx)
	res := make(chan besideRound, 1)
	a.besideRes, a.besideStop = res, cancel
	go func() {
		r.err = p.readRound(ctx, id, &r)
		res <- r
	}()
	return nil
}

// readRound reads one round (besideRound): a capture when the last is
// older than besideRecapture, the split at the first round, then the next
// chunk of each of the first Parallelism() ranges not done, at once.
func (p *Pipeline) readRound(ctx context.Context, id TableID, r *besideRound) error {
	c := p.cfg.Chunks
	par := max(1, c.Parallelism())
	if r.snapAt.IsZero() || time.Since(r.snapAt) > besideRecapture {
		r.snapAt = time.Now()
		var err error
		if r.snap, err = c.Capture(ctx); err != nil {
			return err
		}
	}
	if r.ranges == nil {
		rs, err := c.Split(ctx, id, par)
		if err != nil {
			return err
		}
		if len(rs) == 0 {
			rs = []SnapshotRange{{}}
		}
		r.ranges = rs
		if len(rs) > 1 {
			p.cfg.Logger.Info("snapshot split into key ranges read at once", "source", p.cfg.Source, "table", id.String(), "ranges", len(rs), "readers", par)
		}
	}
	for i, rg := range r.ranges {
		if !rg.Done && len(r.parts) < par {
			r.parts = append(r.parts, besidePart{rng: i})
		}
	}
	errs := make([]error, len(r.parts))
	var wg sync.WaitGroup
	for k := range r.parts {
		part := &r.parts[k]
		wg.Add(1)
		go func() {
			defer wg.Done()
			part.rows, part.next, errs[k] = c.ReadChunk(ctx, id, k, r.ranges[part.rng], r.snap)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// stopBeside cancels the outstanding chunk read and waits for it.
func (a *applier) stopBeside() {
	if a.besideRes != nil {
		a.besideStop()
		<-a.besideRes
		a.besideRes = nil
	}
}

// chunkLanded applies a round of chunks that was read (step 3), then
// records the ranges' cursors (at most every besideSaveEvery), or finishes
// the job after the last chunk of its last range. The round's chunks are
// disjoint key ranges, filtered against the keys taken so far and applied
// at once, each in a session of its own, while the loop waits for them
// (nothing else applies meanwhile): the same as landing them one after
// the other.
func (a *applier) chunkLanded(r besideRound) error {
	p := a.p
	a.besideRes = nil
	a.besideStop()
	b := &p.bg
	b.mu.Lock()
	current := len(b.jobs) > 0 && b.jobs[0] == r.job && r.job.gen == r.gen
	b.mu.Unlock()
	if !current {
		return nil // the job restarted or ended meanwhile
	}
	j := r.job
	if r.err != nil {
		if a.ctx.Err() != nil {
			return nil
		}
		if writerGone(r.err) {
			return fmt.Errorf("snapshot %s: %w", j.id, r.err)
		}
		if errors.Is(r.err, ErrLayoutChanged) {
			// A chunk found the table in another layout than the one
			// read before it (an ALTER the stream has not brought yet):
			// its rows are not landed, and the snapshot restarts from
			// its first chunk after a new capture, which reads the
			// layout again (its DDL, when the stream brings it,
			// restarts it once more).
			return p.queueBeside(a.ctx, j.id, "schema change during its snapshot (found by its read)", nil, Version{})
		}
		p.removeBeside(j.id)
		if errors.Is(r.err, ErrTableGone) {
			return a.besideGone(j)
		}
		return p.quarantine(a.ctx, j.id, fmt.Errorf("snapshot failed: %w", r.err))
	}
	b.mu.Lock()
	read := 0
	for k := range r.parts {
		part := &r.parts[k]
		read += len(part.rows)
		kept := part.rows[:0]
		for _, row := range part.rows {
			if v, ok := j.keys[row.Key()]; ok && v.Compare(r.snap.Version) > 0 {
				j.dropped++
				continue
			}
			kept = append(kept, row)
		}
		part.rows = kept
	}
	b.mu.Unlock()
	if err := a.wait(); err != nil {
		return err
	}
	if err := a.landParts(j, r.parts); err != nil {
		if errors.Is(err, errRoundOver) {
			return nil
		}
		return err
	}
	b.mu.Lock()
	for k, v := range j.keys {
		if v.Compare(r.snap.Version) <= 0 {
			delete(j.keys, k)
		}
	}
	if j.chunks == 0 && !j.resumed {
		j.floor = r.snap.Version
	}
	if j.until.IsZero() {
		j.until = r.snap.Position
	}
	j.snap, j.snapAt = r.snap, r.snapAt
	j.chunks += len(r.parts)
	j.rows += int64(read)
	for _, part := range r.parts {
		r.ranges[part.rng].After = part.next
		r.ranges[part.rng].Done = part.next == nil
	}
	j.ranges = r.ranges
	done := true
	for _, rg := range j.ranges {
		done = done && rg.Done
	}
	save := time.Since(j.savedAt) >= a.p.cfg.SnapshotProgressEvery
	if save {
		j.savedAt = time.Now()
	}
	st := TableState{Table: j.id, Mode: TableSnapshotting, Reason: j.reason, Floor: j.floor}
	ranges := slices.Clone(j.ranges)
	b.mu.Unlock()
	if done {
		b.mu.Lock()
		j.read = true
		b.mu.Unlock()
		return a.finishWhenCaughtUp(j)
	}
	if !save {
		return nil
	}
	target, err := p.targetIdentity(a.ctx, j.id)
	if err != nil {
		if a.ctx.Err() != nil {
			return nil
		}
		return err
	}
	enc, err := encodeRanges(ranges, target)
	if err != nil {
		if !j.noCur {
			j.noCur = true
			p.cfg.Logger.Warn("the snapshot's chunk cursor cannot be stored: a restart redoes this snapshot from its first chunk", "source", p.cfg.Source, "table", j.id.String(), "err", err)
		}
		st.Floor = Version{}
	}
	st.Cursor = enc
	if err := p.setState(a.ctx, st); err != nil && a.ctx.Err() == nil {
		return err
	}
	return nil
}

// finishWhenCaughtUp ends a job whose last chunk landed once the committed
// checkpoint has reached its first capture (step 5); until then it does
// nothing, and the apply loop calls it again (driveBeside) after its next
// event (a batch applied, a chunk taken, the state tick).
func (a *applier) finishWhenCaughtUp(j *besideJob) error {
	a.p.bg.mu.Lock()
	until := j.until
	a.p.bg.mu.Unlock()
	_, last := a.p.Totals()
	if !reached(last, until) {
		return nil
	}
	return a.finishBeside(j)
}

// reached reports whether the committed position last is at or past
// target: by Position.Compare (one server's binlog order first), or by the
// GTID sets when they are equal or, MySQL's, when last includes target
// (set inclusion holds across binlog files: the capture of an idle source
// after a rotation is in a newer file than the last commit).
func reached(last, target Position) bool {
	if c, err := last.Compare(target); err == nil && c >= 0 {
		return true
	}
	if last.GTID == "" || target.GTID == "" || last.Epoch != target.Epoch {
		return false
	}
	if c, err := (Position{GTID: last.GTID}).Compare(Position{GTID: target.GTID}); err == nil && c == 0 {
		return true
	}
	ls, err1 := ParseMySQLGTIDSet(last.GTID)
	ts, err2 := ParseMySQLGTIDSet(target.GTID)
	return err1 == nil && err2 == nil && ls.ContainsSet(ts)
}

// besideGone ends the job of a table renamed or dropped while it was
// snapshotted (a chunk read or the end found it gone), whose RENAME or
// DROP the loop has not taken yet (it ends the job when it does): the
// table is snapshotted again inside the loop, which finds nothing to read,
// empties its target and streams it from a version past the statement, so
// the chunks that landed do not stay as the table's rows. A table of that
// name that exists again by then is snapshotted anew.
func (a *applier) besideGone(j *besideJob) error {
	p := a.p
	p.cfg.Logger.Info("table renamed or dropped while it was snapshotted beside the stream: snapshotting it again", "source", p.cfg.Source, "table", j.id.String())
	// Its changes in flight were applied as the job's.
	if err := a.wait(); err != nil {
		return err
	}
	return p.resnapshot(a.ctx, j.id, j.reason)
}

// errRoundOver: a round ended without landing, and the loop goes on: the
// pipeline stopped (the chunks are read again at the next start), or the
// table was quarantined.
var errRoundOver = errors.New("pipeline stopped")

// landParts applies a round's chunks at once, one Apply (one target
// session) each. A chunk the target refuses for the table quarantines it.
func (a *applier) landParts(j *besideJob, parts []besidePart) error {
	p := a.p
	errs := make([]error, len(parts))
	var wg sync.WaitGroup
	for k := range parts {
		if len(parts[k].rows) == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[k] = p.sink.Apply(a.ctx, &Batch{Source: p.cfg.Source, Changes: parts[k].rows})
		}()
	}
	wg.Wait()
	err := errors.Join(errs...)
	if err == nil {
		return nil
	}
	if a.ctx.Err() != nil {
		return errRoundOver
	}
	var te *TableError
	if errors.As(err, &te) && te.Table == j.id {
		p.removeBeside(j.id)
		if qerr := p.quarantine(a.ctx, j.id, te.Err); qerr != nil {
			return qerr
		}
		return errRoundOver
	}
	return fmt.Errorf("apply snapshot chunk of %s: %w", j.id, err)
}

// finishBeside ends a job whose last chunk landed and whose first capture
// the checkpoint has reached: the table streams from its first chunk's
// version on (nothing older is left to apply).
func (a *applier) finishBeside(j *besideJob) error {
	p := a.p
	if err := p.cfg.Chunks.FinishSnapshot(a.ctx, j.id); err != nil {
		if a.ctx.Err() != nil {
			return nil
		}
		if writerGone(err) {
			return fmt.Errorf("finish snapshot of %s: %w", j.id, err)
		}
		p.removeBeside(j.id)
		if errors.Is(err, ErrTableGone) {
			return a.besideGone(j)
		}
		return p.quarantine(a.ctx, j.id, fmt.Errorf("snapshot failed: %w", err))
	}
	p.bg.mu.Lock()
	st := TableState{Table: j.id, Mode: TableStreaming, Reason: j.reason, Floor: j.floor}
	p.bg.mu.Unlock()
	if bd, ok := p.reg.(SnapshotBoundary); ok {
		// Kafka's consumers remove the rows older than the first
		// chunk's version: no chunk carried them (kafka step 4). A
		// crash before the state below redoes the end (idempotent).
		if err := bd.EndSnapshot(a.ctx, p.cfg.Source, j.id, st.Floor); err != nil {
			if a.ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("finish snapshot of %s: end: %w", j.id, err)
		}
	}
	p.bg.mu.Lock()
	rows, dropped, chunks, resumed, took, nr := j.rows, j.dropped, j.chunks, j.resumed, time.Since(j.started), len(j.ranges)
	p.bg.mu.Unlock()
	if err := p.setState(a.ctx, st); err != nil {
		if a.ctx.Err() != nil {
			return nil
		}
		return err
	}
	p.removeBeside(j.id)
	p.cfg.Logger.Info("table snapshotted; streaming it from the snapshot on", "source", p.cfg.Source, "table", j.id.String(),
		"version", st.Floor.String(), "rows_read", rows, "rows_superseded", dropped, "chunks", chunks, "ranges", nr, "resumed", resumed,
		"took", took.Round(time.Millisecond))
	return nil
}

// targetIdentity names the target table that holds id's rows now
// (TargetIdentity), "" when the registry cannot or the table does not
// exist.
func (p *Pipeline) targetIdentity(ctx context.Context, id TableID) (string, error) {
	ti, ok := p.reg.(TargetIdentity)
	if !ok {
		return "", nil
	}
	name, exists, err := ti.TargetIdentity(ctx, id)
	if err != nil || !exists {
		return "", err
	}
	return name, nil
}

// sameTarget reports whether the chunks recorded in st (an interrupted
// snapshot beside the stream) landed in the target table that holds the
// table's rows now. A cursor stored without an identity is trusted (a
// registry that cannot name its tables, or a cursor older than
// identities). A target table dropped, truncated or rewritten since may
// have lost the rows of the chunks the cursor counts: resuming after it
// would leave them out of the target for good.
func (p *Pipeline) sameTarget(ctx context.Context, st TableState) (bool, error) {
	recorded := rangesTarget(st.Cursor)
	if recorded == "" {
		return true, nil
	}
	if _, ok := p.reg.(TargetIdentity); !ok {
		return true, nil
	}
	now, err := p.targetIdentity(ctx, st.Table)
	if err != nil {
		return false, fmt.Errorf("resume the snapshot of %s: %w", st.Table, err)
	}
	if now == recorded {
		return true, nil
	}
	p.cfg.Logger.Warn("the target table of an interrupted snapshot is not the one its chunk cursor was recorded against (dropped, truncated or rewritten since): redoing the snapshot from its first chunk",
		"source", p.cfg.Source, "table", st.Table.String(), "recorded_target", recorded, "target", now)
	return false, nil
}

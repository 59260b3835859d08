package tidemark

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// stream runs source and applier from pos until ctx is done or an error.
func (p *Pipeline) stream(ctx context.Context, pos Position) error {
	srcCtx, stopSource := context.WithCancel(ctx)
	defer stopSource()
	chunks := make(chan Chunk, p.cfg.QueueChunks)
	srcErr := make(chan error, 1)
	go func() {
		defer close(chunks)
		srcErr <- p.source.Stream(srcCtx, pos, chunks)
	}()
	// The filter runs in its own stage, so that it overlaps with the
	// sink's work (the apply loop mostly waits for the database). Chunks
	// keep their order; the filter is called from this one goroutine.
	in := (<-chan Chunk)(chunks)
	if p.filter != nil {
		filtered := make(chan Chunk, p.cfg.QueueChunks)
		go func() {
			defer close(filtered)
			var carry *Chunk
			for {
				var ch Chunk
				if carry != nil {
					ch, carry = *carry, nil
				} else {
					var ok bool
					if ch, ok = <-chunks; !ok {
						return
					}
				}
				carry = mergeWaiting(&ch, chunks)
				if len(ch.Changes) > 0 {
					ch.Changes = p.filter.Filter(ch.Changes)
				}
				filtered <- ch // the apply loop, or the drain below, reads it
			}
		}()
		in = filtered
	}

	applyErr := p.applyLoop(ctx, in)
	if errors.Is(applyErr, errStopNow) {
		applyErr = nil
	}
	stopSource()
	// Drain so the source (and filter) goroutines can exit, then join the
	// source.
	for range in {
	}
	serr := <-srcErr
	if applyErr != nil {
		return applyErr
	}
	if serr != nil && ctx.Err() == nil {
		return serr
	}
	return nil
}

// mergeMax bounds the changes mergeWaiting gathers into one chunk.
const mergeMax = 1024

// mergeWaiting appends to ch the chunks already waiting in chunks (without
// blocking), so that a busy stream of small transactions costs one filter
// call and one hand-off per group instead of per transaction. The merged
// chunk ends where its last piece ends and carries that piece's commit
// position. It stops before a chunk with DDL (a batch boundary of its own)
// and before the first part of a transaction that does not end in the same
// chunk after a chunk that did end one (the batch would then end at a
// commit with part of the next transaction in it); that chunk is returned,
// to be handled next.
func mergeWaiting(ch *Chunk, chunks <-chan Chunk) *Chunk {
	for len(ch.DDL) == 0 && len(ch.Changes) < mergeMax {
		var next Chunk
		select {
		case c, ok := <-chunks:
			if !ok {
				return nil
			}
			next = c
		default:
			return nil
		}
		// Not after a transaction's end: the part of a transaction that
		// continues would ride with the commit position before it, and a
		// batch ends only at whole transactions where it can.
		if len(next.DDL) > 0 || (!ch.Commit.IsZero() && next.Commit.IsZero()) {
			return &next
		}
		ch.Changes = append(ch.Changes, next.Changes...)
		ch.Watermarks = append(ch.Watermarks, next.Watermarks...)
		if !next.Commit.IsZero() {
			ch.Commit = next.Commit
		}
	}
	return nil
}

// applyLoop batches chunks and applies them until the channel closes or an
// apply fails. After ctx is cancelled the batch in hand is still applied,
// with a fresh deadline.
func (p *Pipeline) applyLoop(ctx context.Context, chunks <-chan Chunk) error {
	a := &applier{p: p, ctx: ctx, batch: newBatcher(&p.cfg)}
	defer func() { _ = a.wait() }() // owned: the background apply ends before the loop
	defer a.stopBeside()            // owned: the chunk read too
	defer a.batch.disarm()
	var tick <-chan time.Time
	if p.reg != nil {
		t := time.NewTicker(p.cfg.StateInterval)
		defer t.Stop()
		tick = t.C
	}
	for {
		if err := a.driveBeside(); err != nil {
			return err
		}
		select {
		case <-p.bg.kick: // a snapshot beside the stream was queued
		case r := <-a.besideRes: // nil (blocks) when no chunk is being read
			if err := a.chunkLanded(r); err != nil {
				return err
			}
		case err := <-a.inflight: // nil (blocks) when no batch is in flight
			a.inflight = nil
			if err != nil {
				return err
			}
			if err := a.flushIdle(); err != nil {
				return err
			}
		case ch, ok := <-chunks:
			if !ok {
				return a.flush()
			}
			if done, err := a.add(ch); done || err != nil {
				return err
			}
			if err := a.flushIdle(); err != nil {
				return err
			}
		case <-a.batch.expired():
			if err := a.flushAsync(); err != nil {
				return err
			}
		case <-tick:
			if ctx.Err() != nil {
				continue
			}
			if err := p.pendingSnapshots(ctx, a.flush); err != nil {
				return err
			}
		}
	}
}

// applier is the state of one applyLoop: the batch being gathered and the
// batch applying in the background. Batches apply one at a time and in
// order, but a full batch applies in the background (flushAsync) while the
// loop gathers the next one: decoding and filtering go on during the
// database's work. At most one batch is in flight; every other flush waits
// for it first.
type applier struct {
	p        *Pipeline
	ctx      context.Context // the loop's: cancelled when the pipeline stops
	batch    *batcher
	inflight chan error // the background apply's result; nil when none
	// besideRes is the round of chunk reads' result (pipeline_beside.go); nil
	// when none is outstanding. besideStop cancels it.
	besideRes  chan besideRound
	besideStop context.CancelFunc
}

// add handles one chunk. A chunk with DDL is a batch boundary: what came
// before it applies with the old schema, what follows with the new one.
// done reports that the loop ends (with err, or nil when stopping).
func (a *applier) add(ch Chunk) (done bool, err error) {
	// Keys of tables snapshotted beside the stream (before anything of
	// the chunk can apply).
	a.p.bg.record(ch.Changes)
	if len(ch.DDL) > 0 {
		if err := a.flush(); err != nil {
			return true, err
		}
		if a.ctx.Err() != nil {
			// Stopping: the DDL and what follows it are streamed again at
			// the next start (the checkpoint is before it).
			return true, nil
		}
		committed, err := a.p.handleDDL(a.ctx, &ch)
		if err != nil {
			return true, err
		}
		if committed { // the last commit since (applyDDL)
			ch.Commit = Position{}
			if len(ch.Changes) == 0 && len(ch.Watermarks) == 0 {
				return false, nil
			}
		}
	}
	// ch.Changes are already filtered (see stream).
	if a.batch.add(&ch) {
		if err := a.flushAsync(); err != nil {
			return true, err
		}
	}
	return false, nil
}

// wait waits for the batch in flight, if any, and returns its error.
func (a *applier) wait() error {
	if a.inflight == nil {
		return nil
	}
	err := <-a.inflight
	a.inflight = nil
	return err
}

// flush applies the batch in hand now, after the one in flight.
func (a *applier) flush() error {
	if err := a.wait(); err != nil {
		return err
	}
	return a.p.applyBatch(a.ctx, a.batch.take())
}

// flushIdle starts applying the batch in hand when FlushWhenIdle is set,
// no batch is in flight, and the batch holds whole transactions.
func (a *applier) flushIdle() error {
	if !a.p.cfg.FlushWhenIdle || a.inflight != nil || !a.batch.whole() || a.ctx.Err() != nil {
		return nil
	}
	return a.flushAsync()
}

// flushAsync starts applying the batch in hand once the one in flight is
// done, and returns.
func (a *applier) flushAsync() error {
	if err := a.wait(); err != nil {
		return err
	}
	b := a.batch.take()
	done := make(chan error, 1)
	a.inflight = done
	go func() { done <- a.p.applyBatch(a.ctx, b) }()
	return nil
}

// applyBatch admits the batch's new tables and applies it, then adds its
// stats to the totals and calls OnApply. ctx is the loop's: an apply is not
// interrupted by the stop signal.
func (p *Pipeline) applyBatch(ctx context.Context, batch *Batch) error {
	if len(batch.Changes) == 0 && batch.Checkpoint.IsZero() && len(batch.Watermarks) == 0 {
		return nil
	}
	// An apply is not interrupted by the stop signal: a cancellation that
	// arrives while it runs gives it StopTimeout to finish (and one that
	// came before gives the final apply the same), so a clean stop never
	// turns into "apply batch: context canceled".
	actx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stopAfter := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(p.cfg.StopTimeout, cancel)
		context.AfterFunc(actx, func() { t.Stop() })
	})
	defer stopAfter()
	start := time.Now()
	// Tables seen for the first time are admitted (and snapshotted when
	// their target does not exist) before their changes apply. Not while
	// stopping: the batch is then left for the next start.
	if ctx.Err() != nil && p.reg != nil && p.cfg.Snapshot != nil && p.tables.hasUnknown(batch) {
		p.cfg.Logger.Info("stopping with changes of a new table in hand: they are left for the next start", "source", p.cfg.Source)
		return errStopNow
	}
	if err := p.admitTables(actx, batch); err != nil {
		return err
	}
	var stats ApplyStats
	err := p.commit(batch.Checkpoint, func() (err error) {
		stats, err = p.applyFiltered(actx, batch)
		return err
	})
	if err != nil {
		return fmt.Errorf("apply batch of %d changes (checkpoint %s): %w", len(batch.Changes), batch.Checkpoint, err)
	}
	if stats.Total() != len(batch.Changes) {
		return fmt.Errorf("apply batch: %d counted for %d changes (%+v): %w", stats.Total(), len(batch.Changes), stats, ErrStatsMismatch)
	}
	took := time.Since(start)
	p.mu.Lock()
	p.total.Add(stats)
	p.mu.Unlock()
	if p.cfg.OnApply != nil {
		p.cfg.OnApply(batch, stats, took)
	}
	return nil
}

// errStopNow ends the apply loop without applying what is in hand (it is
// streamed again at the next start).
var errStopNow = errors.New("stop without applying")

// applyFiltered applies the batch without the changes of tables that are
// not streaming. A *TableError from the sink quarantines that table, and the
// rest of the batch is applied without it. So does one of a constraint a
// load held until the stream passed it (ErrHeldConstraint), whose table
// the batch need not hold: the sink does not build it again.
func (p *Pipeline) applyFiltered(ctx context.Context, b *Batch) (ApplyStats, error) {
	held := map[TableID]bool{}
	for {
		p.tables.filter(b)
		stats, err := p.sink.Apply(ctx, b)
		var te *TableError
		if err == nil || !errors.As(err, &te) {
			return stats, err
		}
		if errors.Is(err, ErrHeldConstraint) && !held[te.Table] {
			held[te.Table] = true
		} else if !batchHas(b, te.Table) {
			return stats, err
		}
		if qerr := p.quarantine(ctx, te.Table, te.Err); qerr != nil {
			return stats, errors.Join(err, qerr)
		}
	}
}

func batchHas(b *Batch, id TableID) bool {
	for i := range b.Changes {
		if b.Changes[i].Table.ID == id {
			return true
		}
	}
	return false
}

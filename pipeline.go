package tidemark

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// PipelineConfig bounds the batches a Pipeline builds. Zero fields take the
// documented defaults.
type PipelineConfig struct {
	// Source names the checkpoint row (required).
	Source string
	// MaxBatchChanges closes a batch at this many changes (default 5000).
	MaxBatchChanges int
	// MaxBatchBytes closes a batch at this estimated size (default 16 MiB).
	MaxBatchBytes int
	// MaxDelay closes a non-empty batch this long after its first change
	// arrived (default 200ms), bounding lag under a light load.
	MaxDelay time.Duration
	// FlushWhenIdle applies a batch that ends at a transaction's commit as
	// soon as no other batch is applying, instead of waiting for MaxDelay
	// or a full batch: a light load is applied a transaction or two at a
	// time (lag ≈ one apply), while under a heavy load batches still grow
	// during the previous batch's apply (group commit). Off, a batch waits
	// for MaxDelay, MaxBatchChanges or MaxBatchBytes.
	FlushWhenIdle bool
	// QueueChunks is the capacity of the channel between source and
	// applier (default 4). Chunks are bounded in bytes by the source, so
	// memory in flight is about QueueChunks × the source's chunk size plus
	// one batch.
	QueueChunks int
	// StopTimeout bounds the final apply after the context is cancelled
	// (default 30s).
	StopTimeout time.Duration
	// Logger receives one line per failure and periodic progress (default
	// discard).
	Logger *slog.Logger
	// OnApply, if set, is called after every committed batch.
	OnApply func(b *Batch, s ApplyStats, took time.Duration)
	// CatchUp, if set, brings the target up to date without the binlog and
	// returns the position to stream from (it stores it as the
	// checkpoint). It runs on the first start (no checkpoint and no start
	// position) and whenever the source reports ErrPositionPurged. Without
	// it, a purged position stops the pipeline with that error.
	CatchUp func(ctx context.Context) (Position, error)
	// Snapshot, if set, snapshots tables without moving the checkpoint. The
	// pipeline uses it for a table that appears in the stream while its
	// target does not exist yet (created, renamed into the include filter,
	// newly included: it may already have rows the stream will never
	// show), after an ALTER TABLE that gave existing rows values the binlog
	// does not carry (Backfill), and for a requested resync. Without it a
	// new table is streamed from where the stream is, and resync requests
	// wait.
	Snapshot SnapshotFunc
	// Chunks, if set with Snapshot and a sink that keeps table states,
	// snapshots those tables beside the stream instead, one key-range
	// chunk at a time between batches (pipeline_beside.go,
	// docs/SNAPSHOTS.md): the other tables keep streaming meanwhile, and
	// a restart resumes after the last chunk. Tables without a key are
	// still snapshotted with Snapshot, inside the apply loop.
	Chunks ChunkSnapshotter
	// OnTableState, if set, is called whenever a table's state changes
	// (quarantined, snapshotted, resynced), e.g. for metrics.
	OnTableState func(TableState)
	// StateInterval is how often the table states recorded in the target
	// are read again, to pick up resync requests (default 2s).
	StateInterval time.Duration
	// LockCheckInterval is how often the source's lock is checked while
	// the pipeline runs, when the sink is a SourceLockChecker (default
	// 3s): on loss Run stops with ErrSourceLockLost.
	LockCheckInterval time.Duration
	// SnapshotProgressEvery is how often, at most, a snapshot beside the
	// stream writes its ranges' cursors to the table's state (default
	// DefaultSnapshotProgressEvery, snapshot.progress_every): a restart
	// re-reads at most the chunks that landed since (a re-read chunk is
	// like any other: read after a capture, its rows lose to newer
	// changes), instead of one write to the target per chunk.
	SnapshotProgressEvery time.Duration
}

// The defaults of PipelineConfig's zero fields.
const (
	// DefaultMaxBatchChanges is MaxBatchChanges' default (batch.max_changes).
	DefaultMaxBatchChanges = 5000
	// DefaultMaxBatchBytes is MaxBatchBytes' default (batch.max_bytes).
	DefaultMaxBatchBytes = 16 << 20
	// DefaultMaxDelay is MaxDelay's default (batch.max_delay).
	DefaultMaxDelay = 200 * time.Millisecond
	// DefaultQueueChunks is QueueChunks' default.
	DefaultQueueChunks = 4
	// DefaultStopTimeout is StopTimeout's default.
	DefaultStopTimeout = 30 * time.Second
	// DefaultStateInterval is StateInterval's default.
	DefaultStateInterval = 2 * time.Second
	// DefaultLockCheckInterval is LockCheckInterval's default.
	DefaultLockCheckInterval = 3 * time.Second
	// DefaultSnapshotProgressEvery is how often a snapshot's range cursors
	// are recorded at most by default, beside the stream
	// (SnapshotProgressEvery) and in a first run (fallback): a second.
	DefaultSnapshotProgressEvery = time.Second
)

func (c *PipelineConfig) setDefaults() {
	if c.MaxBatchChanges <= 0 {
		c.MaxBatchChanges = DefaultMaxBatchChanges
	}
	if c.MaxBatchBytes <= 0 {
		c.MaxBatchBytes = DefaultMaxBatchBytes
	}
	if c.MaxDelay <= 0 {
		c.MaxDelay = DefaultMaxDelay
	}
	if c.QueueChunks <= 0 {
		c.QueueChunks = DefaultQueueChunks
	}
	if c.StopTimeout <= 0 {
		c.StopTimeout = DefaultStopTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.StateInterval <= 0 {
		c.StateInterval = DefaultStateInterval
	}
	if c.LockCheckInterval <= 0 {
		c.LockCheckInterval = DefaultLockCheckInterval
	}
	if c.SnapshotProgressEvery <= 0 {
		c.SnapshotProgressEvery = DefaultSnapshotProgressEvery
	}
}

// Pipeline moves a source's changes through an optional filter into a sink:
// source → bounded channel → filter → batch → Sink.Apply (data and
// checkpoint in one commit).
//
// Tables are replicated independently (see TableMode): a table whose
// changes the sink cannot apply (a *TableError: an incompatible schema
// change, a refused DDL statement) is quarantined — its changes are skipped
// from then on while the checkpoint keeps advancing for the other tables —
// and stays quarantined across restarts until it is resynced. When the sink
// is a TableRegistry the states are recorded in the target; a DDLSink
// applies the source's DROP TABLE, TRUNCATE and ALTER TABLE events; a
// SourceLocker lets one pipeline at a time stream a source.
type Pipeline struct {
	cfg    PipelineConfig
	source Source
	filter Filter
	sink   Sink
	reg    TableRegistry // nil: table states in memory only
	ddl    DDLSink       // nil: DDL events are not applied

	tables tableSet // per-table states (pipeline_tables.go)
	bg     besides  // snapshots beside the stream (pipeline_beside.go)

	mu    sync.Mutex
	total ApplyStats
	last  Position
	// committing is the checkpoint of a commit under way (Apply,
	// ApplyDDL), perhaps committed already; zero when none. catchingUp
	// counts the catch-ups running (they store a checkpoint not known
	// before they return). A lock check reads both (provenSoleWriter).
	committing Position
	catchingUp int
}

// NewPipeline returns a pipeline; filter may be nil.
func NewPipeline(cfg PipelineConfig, src Source, filter Filter, sink Sink) (*Pipeline, error) {
	cfg.setDefaults()
	if cfg.Source == "" {
		return nil, errors.New("pipeline config: source: required")
	}
	if src == nil || sink == nil {
		return nil, errors.New("pipeline config: source and sink are required")
	}
	p := &Pipeline{cfg: cfg, source: src, filter: filter, sink: sink}
	p.bg.kick = make(chan struct{}, 1)
	p.ddl, _ = sink.(DDLSink)
	return p, nil
}

// TableStates returns the state of every table the pipeline knows, sorted
// by name.
func (p *Pipeline) TableStates() []TableState {
	return p.tables.list()
}

// SkippedChanges returns how many changes were skipped because their table
// was quarantined (or they were older than its last snapshot).
func (p *Pipeline) SkippedChanges() uint64 {
	return p.tables.skippedChanges()
}

// Totals returns the stats of every batch applied so far and the last
// committed checkpoint.
func (p *Pipeline) Totals() (ApplyStats, Position) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.total, p.last
}

// setLast records pos as the last committed checkpoint.
func (p *Pipeline) setLast(pos Position) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.last = pos
}

// commit runs fn, which commits checkpoint cp in the sink (nothing when
// cp is zero), with cp recorded as under way, so that a lock check
// meanwhile knows a stored cp for this process's own; cp is the last
// commit once fn succeeded. A failed fn leaves cp under way: its commit's
// outcome may be unknown.
func (p *Pipeline) commit(cp Position, fn func() error) error {
	if cp.IsZero() {
		return fn()
	}
	p.mu.Lock()
	p.committing = cp
	p.mu.Unlock()
	err := fn()
	if err == nil {
		p.mu.Lock()
		p.last, p.committing = cp, Position{}
		p.mu.Unlock()
	}
	return err
}

// catchUp runs the configured catch-up and records the checkpoint it
// stored as the last commit (the snapshots that may follow it before the
// stream starts can take long), counted as running meanwhile.
func (p *Pipeline) catchUp(ctx context.Context) (Position, error) {
	p.mu.Lock()
	p.catchingUp++
	p.mu.Unlock()
	pos, err := p.cfg.CatchUp(ctx)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.catchingUp--
	if err == nil {
		p.last = pos
	}
	return pos, err
}

// Run resumes from the sink's checkpoint (from, when the sink has none) and
// runs until ctx is cancelled or an error occurs. On cancellation it stops
// reading, applies and commits what it has read, and returns nil. It returns
// the first error of the source or the sink otherwise; nothing that was not
// committed is recorded in the checkpoint.
//
// When the sink is a SourceLocker, Run first takes the source's lock,
// waiting while another process holds it (a standby daemon waits here and
// takes over when the active one's session ends). Then, when the sink is an
// Activator, it activates it (fencing an older writer) before reading the
// checkpoint.
func (p *Pipeline) Run(ctx context.Context, from Position) (err error) {
	if l, ok := p.sink.(SourceLocker); ok {
		// Not err: the deferred check below sets Run's own.
		release, lerr := p.lockSource(ctx, l)
		if lerr != nil || release == nil {
			return lerr
		}
		defer release()
		if c, ok := p.sink.(SourceLockChecker); ok {
			var lost context.CancelCauseFunc
			ctx, lost = context.WithCancelCause(ctx)
			lc := &lockCheck{p: p, c: c, lost: lost}
			if w, ok := p.source.(WriterCheckable); ok {
				w.SetWriterCheck(lc.writer)
			}
			done := make(chan struct{})
			go p.watchLock(ctx, lc, done)
			defer func() {
				lost(nil)
				<-done
				if cause := context.Cause(ctx); errors.Is(cause, ErrSourceLockLost) {
					err = cause
				}
			}()
		}
	}
	if a, ok := p.sink.(Activator); ok {
		if err := a.Activate(ctx); err != nil {
			return fmt.Errorf("activate sink of %s: %w", p.cfg.Source, err)
		}
	}
	pos, ok, err := p.sink.Checkpoint(ctx, p.cfg.Source)
	if err != nil {
		return fmt.Errorf("read checkpoint of %s: %w", p.cfg.Source, err)
	}
	if !ok {
		pos = from
	}
	if err := p.loadStates(ctx); err != nil {
		return err
	}
	p.cfg.Logger.Info("starting pipeline", "source", p.cfg.Source, "position", pos.String(), "resumed", ok)
	if !ok && pos.IsZero() && p.cfg.CatchUp != nil {
		p.cfg.Logger.Info("no checkpoint and no start position: taking a snapshot first", "source", p.cfg.Source)
		if pos, err = p.catchUp(ctx); err != nil {
			return fmt.Errorf("initial snapshot of %s: %w", p.cfg.Source, err)
		}
	}
	// Snapshots interrupted by a crash, and resyncs requested while no
	// pipeline ran.
	if err := p.pendingSnapshots(ctx, nil); err != nil {
		return err
	}
	for {
		p.setLast(pos)
		err := p.stream(ctx, pos)
		if err == nil || ctx.Err() != nil || !errors.Is(err, ErrPositionPurged) || p.cfg.CatchUp == nil {
			return err
		}
		p.cfg.Logger.Warn("binlog position purged on the source: catching up with bounded reads", "source", p.cfg.Source, "position", pos.String(), "err", err)
		if pos, err = p.catchUp(ctx); err != nil {
			return fmt.Errorf("catch up %s after a purged position: %w", p.cfg.Source, err)
		}
		// The catch-up left the snapshotting tables out: their chunks
		// that landed miss the gap. And it may have quarantined tables.
		if err := p.restartBesides(ctx, "the binlog position was purged during the snapshot"); err != nil {
			return err
		}
		if err := p.pendingSnapshots(ctx, nil); err != nil {
			return err
		}
		p.cfg.Logger.Info("caught up; resuming the binlog", "source", p.cfg.Source, "position", pos.String())
	}
}

// watchLock checks the source's lock every LockCheckInterval until ctx is
// done; the check cancels ctx with ErrSourceLockLost when another process
// holds the lock, or when the lock had to be taken again and the
// checkpoint shows that another process wrote meanwhile. A check that
// cannot reach the server is repeated (what this pipeline writes cannot
// commit then either). It closes done when it returns.
func (p *Pipeline) watchLock(ctx context.Context, l *lockCheck, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(p.cfg.LockCheckInterval)
	defer t.Stop()
	var unknown int // consecutive checks that could not tell
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		_, err := l.check(ctx)
		switch {
		case ctx.Err() != nil || errors.Is(err, ErrSourceLockLost):
			return
		case err != nil:
			if unknown++; unknown == 1 || unknown%20 == 0 {
				p.cfg.Logger.Warn("cannot check the source lock; checking again", "source", p.cfg.Source, "checks", unknown, "err", err)
			}
		default:
			unknown = 0
		}
	}
}

// lockCheck checks the source's lock for a pipeline: every
// LockCheckInterval (watchLock), and at once when the source asks
// (WriterCheckable). One check runs at a time, so that a source is never
// told the lock is held while another check has taken it again and not
// proven yet that no other process wrote meanwhile.
type lockCheck struct {
	p    *Pipeline
	c    SourceLockChecker
	lost context.CancelCauseFunc // cancels the pipeline with ErrSourceLockLost

	mu sync.Mutex
	// unproven: the lock was taken again and no proof has succeeded yet
	// (a checkpoint that could not be read): every check proves it again.
	unproven bool
	// gone is the ErrSourceLockLost the pipeline was stopped with.
	gone error
}

// check checks the lock once. retaken says it had been taken again on a
// new session and proven (provenSoleWriter). An error wrapping
// ErrSourceLockLost has stopped the pipeline (logged once); any other
// error is a check that could not tell.
func (l *lockCheck) check(ctx context.Context) (retaken bool, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.gone != nil {
		return false, l.gone
	}
	p := l.p
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	retaken, err = l.c.CheckSourceLock(cctx, p.cfg.Source)
	if err == nil && (retaken || l.unproven) {
		l.unproven = true
		if err = p.provenSoleWriter(cctx); err == nil {
			l.unproven, retaken = false, true
		}
	}
	if err == nil || !errors.Is(err, ErrSourceLockLost) || ctx.Err() != nil {
		if retaken {
			p.cfg.Logger.Warn("the source lock's session had ended; took the lock again (no other process wrote meanwhile)", "source", p.cfg.Source)
		}
		return retaken, err
	}
	l.gone = fmt.Errorf("%w of %s: %v; stopping, so that the process that holds it is the only writer", ErrSourceLockLost, p.cfg.Source, err)
	p.cfg.Logger.Error("source lock lost", "source", p.cfg.Source, "err", l.gone)
	l.lost(l.gone)
	return false, l.gone
}

// writer is the source's check (WriterCheckable): nil when this process
// still holds the lock (taken again and proven, if need be).
func (l *lockCheck) writer(ctx context.Context) error {
	_, err := l.check(ctx)
	return err
}

// provenSoleWriter is called after the source's lock was taken again: the
// stored checkpoint must not be past this pipeline's last commit (or be
// the checkpoint of its own commit under way), or another process held
// the lock meanwhile and wrote (ErrSourceLockLost). While a catch-up of
// this pipeline runs, a checkpoint past the last commit may be the one it
// stored: nothing is proven then (an error that is not ErrSourceLockLost;
// the next check proves it again).
func (p *Pipeline) provenSoleWriter(ctx context.Context) error {
	stored, ok, err := p.sink.Checkpoint(ctx, p.cfg.Source)
	if err != nil {
		return fmt.Errorf("read checkpoint after taking the lock again: %w", err)
	}
	p.mu.Lock()
	last, committing, catchingUp := p.last, p.committing, p.catchingUp > 0
	p.mu.Unlock()
	if !ok {
		return nil
	}
	if !committing.IsZero() {
		if c, err := stored.Compare(committing); err == nil && c == 0 {
			return nil // this process's own commit, under way or just made
		}
	}
	past := last.IsZero()
	if !past {
		c, err := stored.Compare(last)
		past = err != nil || c > 0
	}
	switch {
	case !past:
		return nil
	case catchingUp:
		return fmt.Errorf("prove the source lock taken again: the stored checkpoint %s is past this process's last commit %s while its catch-up runs (perhaps the catch-up's own): checking again after it", stored, last)
	case last.IsZero():
		return fmt.Errorf("%w: a checkpoint (%s) was written while this process held no lock and had committed none", ErrSourceLockLost, stored)
	}
	return fmt.Errorf("%w: the stored checkpoint %s is past this process's last commit %s: another process wrote while the lock was free", ErrSourceLockLost, stored, last)
}

// lockRetryFor is how long lockSource tries again after failed attempts.
const lockRetryFor = 30 * time.Second

// lockSource takes the source's lock, waiting while another process holds
// it, and trying again for lockRetryFor while the attempt fails (the target
// restarting). It returns a nil release when ctx is done first.
func (p *Pipeline) lockSource(ctx context.Context, l SourceLocker) (func(), error) {
	logged := false
	var first time.Time // of the current run of failed attempts
	for {
		release, ok, err := l.TryLockSource(ctx, p.cfg.Source)
		if errors.Is(err, errors.ErrUnsupported) {
			return func() {}, nil
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, nil
			}
			// The target may be restarting (a daemon started during a
			// PostgreSQL restart): try again for lockRetryFor, then stop
			// with the error.
			if first.IsZero() {
				first = time.Now()
				p.cfg.Logger.Warn("cannot take the source lock; trying again", "source", p.cfg.Source, "for", lockRetryFor, "err", err)
			}
			if time.Since(first) > lockRetryFor {
				return nil, fmt.Errorf("lock source %s: %w", p.cfg.Source, err)
			}
		} else if ok {
			return release, nil
		} else {
			first = time.Time{}
		}
		if err == nil && !logged {
			p.cfg.Logger.Warn("another tidemark process is streaming this source; waiting for it to stop", "source", p.cfg.Source)
			logged = true
		}
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(time.Second):
		}
	}
}

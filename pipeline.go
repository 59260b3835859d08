package tidemark

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
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
	// OnTableState, if set, is called whenever a table's state changes
	// (quarantined, snapshotted, resynced), e.g. for metrics.
	OnTableState func(TableState)
	// StateInterval is how often the table states recorded in the target
	// are read again, to pick up resync requests (default 2s).
	StateInterval time.Duration
}

func (c *PipelineConfig) setDefaults() {
	if c.MaxBatchChanges <= 0 {
		c.MaxBatchChanges = 5000
	}
	if c.MaxBatchBytes <= 0 {
		c.MaxBatchBytes = 16 << 20
	}
	if c.MaxDelay <= 0 {
		c.MaxDelay = 200 * time.Millisecond
	}
	if c.QueueChunks <= 0 {
		c.QueueChunks = 4
	}
	if c.StopTimeout <= 0 {
		c.StopTimeout = 30 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.StateInterval <= 0 {
		c.StateInterval = 2 * time.Second
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

	mu      sync.Mutex
	total   ApplyStats
	last    Position
	tables  map[TableID]TableState
	skipped uint64
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
	p := &Pipeline{cfg: cfg, source: src, filter: filter, sink: sink, tables: map[TableID]TableState{}}
	p.ddl, _ = sink.(DDLSink)
	return p, nil
}

// TableStates returns the state of every table the pipeline knows, sorted
// by name.
func (p *Pipeline) TableStates() []TableState {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]TableState, 0, len(p.tables))
	for _, st := range p.tables {
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Table.String() < out[j].Table.String() })
	return out
}

// SkippedChanges returns how many changes were skipped because their table
// was quarantined (or they were older than its last snapshot).
func (p *Pipeline) SkippedChanges() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.skipped
}

// Totals returns the stats of every batch applied so far and the last
// committed checkpoint.
func (p *Pipeline) Totals() (ApplyStats, Position) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.total, p.last
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
func (p *Pipeline) Run(ctx context.Context, from Position) error {
	if l, ok := p.sink.(SourceLocker); ok {
		release, err := p.lockSource(ctx, l)
		if err != nil || release == nil {
			return err
		}
		defer release()
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
		if pos, err = p.cfg.CatchUp(ctx); err != nil {
			return fmt.Errorf("initial snapshot of %s: %w", p.cfg.Source, err)
		}
	}
	// Snapshots interrupted by a crash, and resyncs requested while no
	// pipeline ran.
	if err := p.pendingSnapshots(ctx, nil); err != nil {
		return err
	}
	for {
		p.mu.Lock()
		p.last = pos
		p.mu.Unlock()
		err := p.stream(ctx, pos)
		if err == nil || ctx.Err() != nil || !errors.Is(err, ErrPositionPurged) || p.cfg.CatchUp == nil {
			return err
		}
		p.cfg.Logger.Warn("binlog position purged on the source: catching up with bounded reads", "source", p.cfg.Source, "position", pos.String(), "err", err)
		if pos, err = p.cfg.CatchUp(ctx); err != nil {
			return fmt.Errorf("catch up %s after a purged position: %w", p.cfg.Source, err)
		}
		// The catch-up may have quarantined tables.
		if err := p.pendingSnapshots(ctx, nil); err != nil {
			return err
		}
		p.cfg.Logger.Info("caught up; resuming the binlog", "source", p.cfg.Source, "position", pos.String())
	}
}

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
	batch := &Batch{Source: p.cfg.Source}
	bytes := 0
	var timer *time.Timer
	var timerC <-chan time.Time
	var tick <-chan time.Time
	if p.reg != nil {
		t := time.NewTicker(p.cfg.StateInterval)
		defer t.Stop()
		tick = t.C
	}
	// Batches apply one at a time and in order, but a full batch applies
	// in the background (flushAsync) while the loop gathers the next one:
	// decoding and filtering go on during the database's work. At most
	// one batch is in flight; every other flush waits for it first.
	var inflight chan error
	wait := func() error {
		if inflight == nil {
			return nil
		}
		err := <-inflight
		inflight = nil
		return err
	}
	defer func() { _ = wait() }() // owned: the background apply ends before the loop
	take := func() *Batch {
		if timer != nil {
			timer.Stop()
			timer, timerC = nil, nil
		}
		b := batch
		batch = &Batch{Source: p.cfg.Source}
		bytes = 0
		return b
	}
	apply := func(batch *Batch) error {
		if len(batch.Changes) == 0 && batch.Checkpoint.IsZero() && len(batch.Watermarks) == 0 {
			return nil
		}
		// An apply is not interrupted by the stop signal: a cancellation
		// that arrives while it runs gives it StopTimeout to finish (and
		// one that came before gives the final apply the same), so a clean
		// stop never turns into "apply batch: context canceled".
		actx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		defer cancel()
		stopAfter := context.AfterFunc(ctx, func() {
			t := time.AfterFunc(p.cfg.StopTimeout, cancel)
			context.AfterFunc(actx, func() { t.Stop() })
		})
		defer stopAfter()
		start := time.Now()
		// Tables seen for the first time are admitted (and snapshotted
		// when their target does not exist) before their changes apply.
		// Not while stopping: the batch is then left for the next start.
		if ctx.Err() != nil && p.reg != nil && p.cfg.Snapshot != nil && p.hasUnknownTables(batch) {
			p.cfg.Logger.Info("stopping with changes of a new table in hand: they are left for the next start", "source", p.cfg.Source)
			return errStopNow
		}
		if err := p.admitTables(actx, batch); err != nil {
			return err
		}
		stats, err := p.applyFiltered(actx, batch)
		if err != nil {
			return fmt.Errorf("apply batch of %d changes (checkpoint %s): %w", len(batch.Changes), batch.Checkpoint, err)
		}
		if stats.Total() != len(batch.Changes) {
			return fmt.Errorf("apply batch: %d counted for %d changes (%+v): %w", stats.Total(), len(batch.Changes), stats, ErrStatsMismatch)
		}
		took := time.Since(start)
		p.mu.Lock()
		p.total.Add(stats)
		if !batch.Checkpoint.IsZero() {
			p.last = batch.Checkpoint
		}
		p.mu.Unlock()
		if p.cfg.OnApply != nil {
			p.cfg.OnApply(batch, stats, took)
		}
		return nil
	}
	// flush applies the batch in hand now, after the one in flight.
	flush := func() error {
		if err := wait(); err != nil {
			return err
		}
		return apply(take())
	}
	// flushAsync starts applying the batch in hand once the one in flight
	// is done, and returns.
	flushAsync := func() error {
		if err := wait(); err != nil {
			return err
		}
		b := take()
		done := make(chan error, 1)
		inflight = done
		go func() { done <- apply(b) }()
		return nil
	}
	for {
		select {
		case err := <-inflight: // nil (blocks) when no batch is in flight
			inflight = nil
			if err != nil {
				return err
			}
		case ch, ok := <-chunks:
			if !ok {
				return flush()
			}
			if len(ch.DDL) > 0 {
				// A schema change is a batch boundary: what came before
				// it applies with the old schema, what follows with the
				// new one.
				if err := flush(); err != nil {
					return err
				}
				if ctx.Err() != nil {
					// Stopping: the DDL and what follows it are streamed
					// again at the next start (the checkpoint is before
					// it).
					return nil
				}
				committed, err := p.handleDDL(ctx, &ch)
				if err != nil {
					return err
				}
				if committed {
					p.mu.Lock()
					p.last = ch.Commit
					p.mu.Unlock()
					ch.Commit = Position{}
					if len(ch.Changes) == 0 && len(ch.Watermarks) == 0 {
						continue
					}
				}
			}
			changes := ch.Changes // already filtered (see stream)
			if len(batch.Changes) == 0 && len(changes) > 0 && timer == nil {
				timer = time.NewTimer(p.cfg.MaxDelay)
				timerC = timer.C
			}
			batch.Changes = append(batch.Changes, changes...)
			for i := range changes {
				bytes += changes[i].Size
			}
			batch.Watermarks = append(batch.Watermarks, ch.Watermarks...)
			if !ch.Commit.IsZero() {
				batch.Checkpoint = ch.Commit
			}
			full := len(batch.Changes) >= p.cfg.MaxBatchChanges || bytes >= p.cfg.MaxBatchBytes
			// A batch ends at a transaction boundary when it can: a
			// full batch is flushed on the next commit, or at once when
			// it is twice over (a transaction larger than a batch).
			if (full && !ch.Commit.IsZero()) || len(batch.Changes) >= 2*p.cfg.MaxBatchChanges || bytes >= 2*p.cfg.MaxBatchBytes {
				// For a split transaction the checkpoint stays at the last
				// boundary inside this batch (possibly none).
				if err := flushAsync(); err != nil {
					return err
				}
			} else if len(batch.Changes) == 0 && !ch.Commit.IsZero() && len(ch.Watermarks) == 0 && timer == nil {
				// Only positions moved (transactions on other tables):
				// record them at the next delay tick.
				timer = time.NewTimer(p.cfg.MaxDelay)
				timerC = timer.C
			}
		case <-timerC:
			timer, timerC = nil, nil
			if err := flushAsync(); err != nil {
				return err
			}
		case <-tick:
			if ctx.Err() != nil {
				continue
			}
			if err := p.pendingSnapshots(ctx, flush); err != nil {
				return err
			}
		}
	}
}

// errStopNow ends the apply loop without applying what is in hand (it is
// streamed again at the next start).
var errStopNow = errors.New("stop without applying")

// lockSource takes the source's lock, waiting while another process holds
// it. It returns a nil release when ctx is done first.
func (p *Pipeline) lockSource(ctx context.Context, l SourceLocker) (func(), error) {
	logged := false
	for {
		release, ok, err := l.TryLockSource(ctx, p.cfg.Source)
		if errors.Is(err, errors.ErrUnsupported) {
			return func() {}, nil
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, nil
			}
			return nil, fmt.Errorf("lock source %s: %w", p.cfg.Source, err)
		}
		if ok {
			return release, nil
		}
		if !logged {
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

// loadStates reads the recorded table states, when the sink keeps them.
func (p *Pipeline) loadStates(ctx context.Context) error {
	reg, ok := p.sink.(TableRegistry)
	if !ok {
		return nil
	}
	states, err := reg.TableStates(ctx, p.cfg.Source)
	if errors.Is(err, errors.ErrUnsupported) {
		p.cfg.Logger.Info("the sink does not record table states: quarantines last until the process stops", "source", p.cfg.Source)
		return nil
	}
	if err != nil {
		return fmt.Errorf("read table states of %s: %w", p.cfg.Source, err)
	}
	p.reg = reg
	p.mu.Lock()
	clear(p.tables)
	p.mu.Unlock()
	for _, st := range states {
		p.remember(st)
	}
	for _, st := range states {
		if st.Mode == TableQuarantined {
			p.cfg.Logger.Error("table is quarantined: its changes are skipped until it is resynced (tidemark resync --table "+st.Table.String()+")",
				"source", p.cfg.Source, "table", st.Table.String(), "reason", st.Reason, "since", st.UpdatedAt)
		}
	}
	return nil
}

// state returns the state of a table and whether the pipeline knows it.
func (p *Pipeline) state(id TableID) (TableState, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	st, ok := p.tables[id]
	return st, ok
}

// setState records a table's state (in the target when the sink keeps
// states) and reports the change.
func (p *Pipeline) setState(ctx context.Context, st TableState) error {
	if p.reg != nil {
		if err := p.reg.SetTableState(ctx, p.cfg.Source, st); err != nil {
			return fmt.Errorf("record state of %s: %w", st.Table, err)
		}
	}
	p.remember(st)
	return nil
}

func (p *Pipeline) remember(st TableState) {
	p.mu.Lock()
	old, had := p.tables[st.Table]
	p.tables[st.Table] = st
	p.mu.Unlock()
	if p.cfg.OnTableState != nil && (!had || old.Mode != st.Mode || old.Floor != st.Floor || old.Reason != st.Reason) {
		p.cfg.OnTableState(st)
	}
}

// quarantine stops applying a table's changes. The reason goes to the log
// (once, at error level), the recorded state and OnTableState.
func (p *Pipeline) quarantine(ctx context.Context, id TableID, cause error) error {
	st := TableState{Table: id, Mode: TableQuarantined, Reason: cause.Error()}
	p.cfg.Logger.Error("table quarantined: its changes are skipped from now on; the other tables continue. Resync it with `tidemark resync --table "+id.String()+"` once the cause is fixed",
		"source", p.cfg.Source, "table", id.String(), "reason", st.Reason)
	return p.setState(ctx, st)
}

// resnapshot takes a table through Resnapshot. A failure other than
// cancellation quarantines the table instead of stopping the pipeline.
func (p *Pipeline) resnapshot(ctx context.Context, id TableID, reason string) error {
	if p.cfg.Snapshot == nil || p.reg == nil {
		// Nothing to snapshot with: stream the table from here.
		return p.setState(ctx, TableState{Table: id, Mode: TableStreaming, Reason: reason})
	}
	p.cfg.Logger.Info("snapshotting table", "source", p.cfg.Source, "table", id.String(), "reason", reason)
	start := time.Now()
	p.remember(TableState{Table: id, Mode: TableSnapshotting, Reason: reason})
	st, err := Resnapshot(ctx, p.reg, p.cfg.Source, id, p.cfg.Snapshot, reason)
	if err != nil {
		if ctx.Err() != nil {
			return err
		}
		if IsRegistryError(err) {
			// Recording the state or dropping the target failed: not the
			// table's fault. Stop; the table stays snapshotting and the
			// next start redoes the snapshot.
			return err
		}
		// Reading or loading the table failed (after the retries of the
		// reader and the sink): quarantine it, the others go on.
		return p.quarantine(ctx, id, fmt.Errorf("snapshot failed: %w", err))
	}
	p.remember(st)
	p.cfg.Logger.Info("table snapshotted; streaming it from the snapshot on", "source", p.cfg.Source, "table", id.String(),
		"version", st.Floor.String(), "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// pendingSnapshots reads the recorded states again and performs what they
// ask for: resyncs requested (tidemark resync) and snapshots a crash
// interrupted. flush, when not nil, first applies the batch in hand.
func (p *Pipeline) pendingSnapshots(ctx context.Context, flush func() error) error {
	if p.reg == nil {
		return nil
	}
	states, err := p.reg.TableStates(ctx, p.cfg.Source)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("read table states of %s: %w", p.cfg.Source, err)
	}
	var todo []TableState
	for _, st := range states {
		if st.Mode == TableResyncRequested || st.Mode == TableSnapshotting {
			todo = append(todo, st)
			continue
		}
		if cur, ok := p.state(st.Table); !ok || cur.Mode != st.Mode || cur.Floor != st.Floor {
			p.remember(st)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	if flush != nil {
		if err := flush(); err != nil {
			return err
		}
	}
	for _, st := range todo {
		reason := st.Reason
		if st.Mode == TableResyncRequested {
			reason = "resync requested"
			p.cfg.Logger.Info("resync requested: re-snapshotting the table", "source", p.cfg.Source, "table", st.Table.String())
		} else {
			p.cfg.Logger.Info("finishing an interrupted snapshot", "source", p.cfg.Source, "table", st.Table.String(), "reason", st.Reason)
		}
		p.remember(st)
		if err := p.resnapshot(ctx, st.Table, reason); err != nil {
			return err
		}
	}
	return nil
}

// hasUnknownTables reports whether the batch has changes of a table the
// pipeline has not admitted yet.
func (p *Pipeline) hasUnknownTables(b *Batch) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range b.Changes {
		if _, ok := p.tables[b.Changes[i].Table.ID]; !ok {
			return true
		}
	}
	return false
}

// admitTables admits the batch's tables that the pipeline sees for the
// first time.
func (p *Pipeline) admitTables(ctx context.Context, b *Batch) error {
	var seen map[TableID]bool
	for i := range b.Changes {
		id := b.Changes[i].Table.ID
		if _, ok := p.state(id); ok || seen[id] {
			continue
		}
		if seen == nil {
			seen = map[TableID]bool{}
		}
		seen[id] = true
		if err := p.admit(ctx, id); err != nil {
			return err
		}
	}
	return nil
}

// admit starts replicating a table the pipeline has not seen before. When
// its target does not exist yet it is snapshotted first: it may hold rows
// that the stream will never show (a table renamed into the include filter,
// or newly included). A table whose target exists is streamed from here.
func (p *Pipeline) admit(ctx context.Context, id TableID) error {
	if p.reg == nil {
		p.remember(TableState{Table: id, Mode: TableStreaming})
		return nil
	}
	has, err := p.reg.HasTable(ctx, id)
	if err != nil {
		return fmt.Errorf("look up target of %s: %w", id, err)
	}
	if has {
		return p.setState(ctx, TableState{Table: id, Mode: TableStreaming})
	}
	return p.resnapshot(ctx, id, "new table")
}

// filter removes the changes of tables that are not streaming and the
// changes older than their table's last snapshot.
func (p *Pipeline) filterBatch(b *Batch) {
	p.mu.Lock()
	defer p.mu.Unlock()
	kept := b.Changes[:0]
	for _, c := range b.Changes {
		if st, ok := p.tables[c.Table.ID]; ok && st.Skips(c.Version) {
			p.skipped++
			continue
		}
		kept = append(kept, c)
	}
	clear(b.Changes[len(kept):])
	b.Changes = kept
}

// applyFiltered applies the batch without the changes of tables that are
// not streaming. A *TableError from the sink quarantines that table, and the
// rest of the batch is applied without it.
func (p *Pipeline) applyFiltered(ctx context.Context, b *Batch) (ApplyStats, error) {
	for {
		p.filterBatch(b)
		stats, err := p.sink.Apply(ctx, b)
		var te *TableError
		if err == nil || !errors.As(err, &te) || !batchHas(b, te.Table) {
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

// handleDDL applies a chunk's schema changes. DROP TABLE, TRUNCATE and
// ALTER TABLE go to the sink (with the chunk's checkpoint when the chunk
// holds nothing else: committed reports that); a refused or inapplicable one
// quarantines its table. CREATE TABLE admits the table (streamed from here;
// a table renamed into the stream is snapshotted); an ALTER TABLE that
// needs a backfill re-snapshots it.
func (p *Pipeline) handleDDL(ctx context.Context, ch *Chunk) (committed bool, err error) {
	var events []DDLEvent
	var creates []DDLEvent
	var backfills []TableID
	for _, ev := range ch.DDL {
		st, known := p.state(ev.Table)
		if known && st.Skips(ev.Version) {
			continue // quarantined, or older than the table's snapshot
		}
		switch ev.Op {
		case DDLUndecodable:
			if err := p.quarantine(ctx, ev.Table, &TableError{Table: ev.Table, Err: fmt.Errorf("%s: %w", ev.Reason, ErrUndecodable)}); err != nil {
				return false, err
			}
		case DDLCreateTable:
			creates = append(creates, ev)
		default:
			if ev.Op == DDLAlterTable && ev.Backfill && p.cfg.Snapshot != nil && p.reg != nil {
				// Recorded first, so that a crash after the ALTER's
				// checkpoint commits still redoes the backfill.
				st := TableState{Table: ev.Table, Mode: TableSnapshotting, Reason: "backfill after ALTER TABLE (existing rows got values the binlog does not carry)"}
				if err := p.setState(ctx, st); err != nil {
					return false, err
				}
				backfills = append(backfills, ev.Table)
			}
			events = append(events, ev)
		}
	}
	if len(events) > 0 && p.ddl != nil {
		var cp Position
		if len(ch.Changes) == 0 && len(ch.Watermarks) == 0 {
			cp = ch.Commit
		}
		for len(events) > 0 {
			err := p.ddl.ApplyDDL(ctx, p.cfg.Source, events, cp)
			var te *TableError
			if err == nil {
				committed = !cp.IsZero()
				break
			}
			if !errors.As(err, &te) {
				return false, fmt.Errorf("apply DDL of %s: %w", p.cfg.Source, err)
			}
			if err := p.quarantine(ctx, te.Table, te.Err); err != nil {
				return false, err
			}
			kept := events[:0]
			for _, ev := range events {
				if ev.Table != te.Table {
					kept = append(kept, ev)
				}
			}
			if len(kept) == len(events) {
				return false, fmt.Errorf("apply DDL of %s: %w", p.cfg.Source, err)
			}
			events = kept
			if len(events) == 0 && !cp.IsZero() {
				// Nothing left to apply: the checkpoint goes with the
				// next batch.
				break
			}
		}
		for _, ev := range events {
			if ev.Op == DDLDropTable {
				p.mu.Lock()
				delete(p.tables, ev.Table)
				p.mu.Unlock()
				// The sink says when it dropped a target table; a DROP
				// TABLE of a table that never reached the target drops
				// nothing.
				p.cfg.Logger.Debug("DROP TABLE applied; the table's state is forgotten", "source", p.cfg.Source, "table", ev.Table.String(), "reason", ev.Reason)
			}
		}
	} else if len(events) > 0 {
		p.cfg.Logger.Debug("the sink does not apply DDL; ignoring", "source", p.cfg.Source, "events", len(events))
	}
	for _, id := range backfills {
		if st, _ := p.state(id); st.Mode == TableQuarantined {
			continue
		}
		if err := p.resnapshot(ctx, id, "backfill after ALTER TABLE"); err != nil {
			return committed, err
		}
	}
	for _, ev := range creates {
		if _, ok := p.state(ev.Table); ok {
			continue
		}
		if ev.From == (TableID{}) {
			// Created here: every row of it follows in the stream.
			if err := p.setState(ctx, TableState{Table: ev.Table, Mode: TableStreaming}); err != nil {
				return committed, err
			}
			continue
		}
		// Renamed into the stream: its rows are not in it.
		if err := p.admit(ctx, ev.Table); err != nil {
			return committed, err
		}
	}
	return committed, nil
}

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
}

// Pipeline moves a source's changes through an optional filter into a sink:
// source → bounded channel → filter → batch → Sink.Apply (data and
// checkpoint in one commit).
type Pipeline struct {
	cfg    PipelineConfig
	source Source
	filter Filter
	sink   Sink

	mu    sync.Mutex
	total ApplyStats
	last  Position
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
	return &Pipeline{cfg: cfg, source: src, filter: filter, sink: sink}, nil
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
func (p *Pipeline) Run(ctx context.Context, from Position) error {
	pos, ok, err := p.sink.Checkpoint(ctx, p.cfg.Source)
	if err != nil {
		return fmt.Errorf("read checkpoint of %s: %w", p.cfg.Source, err)
	}
	if !ok {
		pos = from
	}
	p.cfg.Logger.Info("starting pipeline", "source", p.cfg.Source, "position", pos.String(), "resumed", ok)
	if !ok && pos.IsZero() && p.cfg.CatchUp != nil {
		p.cfg.Logger.Info("no checkpoint and no start position: taking a snapshot first", "source", p.cfg.Source)
		if pos, err = p.cfg.CatchUp(ctx); err != nil {
			return fmt.Errorf("initial snapshot of %s: %w", p.cfg.Source, err)
		}
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

	applyErr := p.applyLoop(ctx, chunks)
	stopSource()
	// Drain so the source goroutine can exit, then join it.
	for range chunks {
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

// applyLoop batches chunks and applies them until the channel closes or an
// apply fails. After ctx is cancelled the batch in hand is still applied,
// with a fresh deadline.
func (p *Pipeline) applyLoop(ctx context.Context, chunks <-chan Chunk) error {
	batch := &Batch{Source: p.cfg.Source}
	bytes := 0
	var timer *time.Timer
	var timerC <-chan time.Time
	flush := func() error {
		if timer != nil {
			timer.Stop()
			timer, timerC = nil, nil
		}
		if len(batch.Changes) == 0 && batch.Checkpoint.IsZero() && len(batch.Watermarks) == 0 {
			return nil
		}
		actx := ctx
		if ctx.Err() != nil {
			var cancel context.CancelFunc
			actx, cancel = context.WithTimeout(context.WithoutCancel(ctx), p.cfg.StopTimeout)
			defer cancel()
		}
		start := time.Now()
		stats, err := p.sink.Apply(actx, batch)
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
		batch = &Batch{Source: p.cfg.Source}
		bytes = 0
		return nil
	}
	for {
		select {
		case ch, ok := <-chunks:
			if !ok {
				return flush()
			}
			changes := ch.Changes
			if p.filter != nil && len(changes) > 0 {
				changes = p.filter.Filter(changes)
			}
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
				if err := flush(); err != nil {
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
			if err := flush(); err != nil {
				return err
			}
		}
	}
}

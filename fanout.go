package tidemark

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// FanoutTarget is one sink of a Fanout and the name its errors carry
// ("postgres", "kafka").
type FanoutTarget struct {
	Name string
	Sink Sink
}

// Fanout is a Sink that applies every batch to several sinks (PostgreSQL and
// Kafka, say), so that one source feeds them all. Each sink commits a batch
// and its own copy of the checkpoint atomically, but the sinks do not commit
// together: a crash between two sinks' commits leaves the first one ahead.
// Fanout makes that safe by resuming from the oldest checkpoint, so that no
// sink can miss a change, and relies on every sink to absorb the replay of
// batches it already has:
//
//   - the PostgreSQL sink's version guard turns them into no-ops (Skipped);
//   - the Kafka sink drops a batch whose checkpoint is not newer than its
//     stored one (Skipped), so that with exactly-once delivery Kafka still
//     gets every change once. A replayed batch cut at different boundaries
//     than the original can straddle the Kafka checkpoint; the Kafka sink
//     then publishes it whole (duplicates). Putting Kafka last avoids that:
//     a sink later in the order is never ahead of an earlier one, so the
//     resume point is Kafka's own checkpoint.
//
// So list the sinks that absorb replays exactly first and Kafka last.
type Fanout struct {
	targets []FanoutTarget
}

var (
	_ Sink           = (*Fanout)(nil)
	_ WatermarkStore = (*Fanout)(nil)
	_ Activator      = (*Fanout)(nil)
)

// NewFanout returns a Fanout over targets, applied in the given order. Names
// must be non-empty and distinct.
func NewFanout(targets ...FanoutTarget) (*Fanout, error) {
	if len(targets) == 0 {
		return nil, errors.New("fanout: no sinks")
	}
	seen := map[string]bool{}
	for i, t := range targets {
		switch {
		case t.Name == "":
			return nil, fmt.Errorf("fanout: sink %d: name: required", i)
		case seen[t.Name]:
			return nil, fmt.Errorf("fanout: sink %d: name %q used twice", i, t.Name)
		case t.Sink == nil:
			return nil, fmt.Errorf("fanout: sink %s: nil", t.Name)
		}
		seen[t.Name] = true
	}
	return &Fanout{targets: append([]FanoutTarget(nil), targets...)}, nil
}

// Apply applies b to every sink, one after the other, in order: sequential
// is simple, keeps each sink's batches in source order, and bounds memory to
// one batch. It stops at the first sink that fails; the sinks before it
// have committed the batch and the sinks after it have not (Checkpoint's
// oldest position covers that).
//
// Apply returns the first sink's stats, the count the pipeline reports. Each
// sink's counts must add up to len(b.Changes), or Apply fails with
// ErrStatsMismatch naming the sink.
func (f *Fanout) Apply(ctx context.Context, b *Batch) (ApplyStats, error) {
	var first ApplyStats
	for i, t := range f.targets {
		s, err := t.Sink.Apply(ctx, b)
		if err != nil {
			return ApplyStats{}, fmt.Errorf("apply batch to %s: %w", t.Name, err)
		}
		if s.Total() != len(b.Changes) {
			return ApplyStats{}, fmt.Errorf("apply batch to %s: %d counted for %d changes (%+v): %w", t.Name, s.Total(), len(b.Changes), s, ErrStatsMismatch)
		}
		if i == 0 {
			first = s
		}
	}
	return first, nil
}

// Checkpoint returns the oldest of the sinks' checkpoints for source: the
// pipeline resumes there, so every sink gets every change after its own
// checkpoint. If any sink has none, Fanout has none (the pipeline starts from
// its configured start position, and the sinks that have more absorb the
// replay). Checkpoints that cannot be ordered are an error wrapping
// ErrIncomparable that names the sinks.
func (f *Fanout) Checkpoint(ctx context.Context, source string) (Position, bool, error) {
	var (
		oldest Position
		from   string
	)
	for i, t := range f.targets {
		pos, ok, err := t.Sink.Checkpoint(ctx, source)
		if err != nil {
			return Position{}, false, fmt.Errorf("read checkpoint of %s from %s: %w", source, t.Name, err)
		}
		if !ok {
			return Position{}, false, nil
		}
		if i == 0 {
			oldest, from = pos, t.Name
			continue
		}
		c, err := pos.Compare(oldest)
		if err != nil {
			return Position{}, false, fmt.Errorf("compare checkpoints of %s in %s (%s) and %s (%s): %w", source, t.Name, pos, from, oldest, err)
		}
		if c < 0 {
			oldest, from = pos, t.Name
		}
	}
	return oldest, true, nil
}

// Watermark returns the oldest of the sinks' catch-up watermarks for table,
// for the same reason Checkpoint returns the oldest position: a catch-up
// from there reads every row that some sink lacks. A sink that has none for
// the table, or does not store watermarks (is not a WatermarkStore), makes it
// none: the catch-up reads the table from the start.
func (f *Fanout) Watermark(ctx context.Context, source string, table TableID) (time.Time, bool, error) {
	var oldest time.Time
	for i, t := range f.targets {
		ws, ok := t.Sink.(WatermarkStore)
		if !ok {
			return time.Time{}, false, nil
		}
		w, ok, err := ws.Watermark(ctx, source, table)
		if err != nil {
			return time.Time{}, false, fmt.Errorf("read watermark of %s from %s: %w", table, t.Name, err)
		}
		if !ok {
			return time.Time{}, false, nil
		}
		if i == 0 || w.Before(oldest) {
			oldest = w
		}
	}
	return oldest, true, nil
}

// Activate activates, in order, every target that is an Activator.
func (f *Fanout) Activate(ctx context.Context) error {
	for _, t := range f.targets {
		if a, ok := t.Sink.(Activator); ok {
			if err := a.Activate(ctx); err != nil {
				return fmt.Errorf("activate %s: %w", t.Name, err)
			}
		}
	}
	return nil
}

// Close closes every sink and returns their errors joined.
func (f *Fanout) Close() error {
	var errs []error
	for _, t := range f.targets {
		if err := t.Sink.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close %s: %w", t.Name, err))
		}
	}
	return errors.Join(errs...)
}

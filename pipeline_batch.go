package tidemark

import "time"

// batcher gathers chunks into the batch in hand and says where a batch
// ends. A batch ends at a transaction boundary when it can: once it holds
// maxChanges changes or maxBytes bytes it is cut at the next commit, or at
// once when it is twice over (a transaction larger than a batch; its
// checkpoint then stays at the last boundary inside the batch, possibly
// none). A batch that is not full is cut when its delay timer fires: the
// timer is armed by the batch's first change, or by a commit position that
// arrives with no changes (transactions on other tables), so positions are
// recorded within delay.
type batcher struct {
	source     string
	maxChanges int
	maxBytes   int
	delay      time.Duration

	batch *Batch
	bytes int
	timer *time.Timer // nil: not armed
	// atCommit: the last chunk added ended at a commit (the batch in hand
	// holds whole transactions only).
	atCommit bool
}

// newBatcher returns a batcher with an empty batch for cfg's source and
// limits (cfg's defaults set).
func newBatcher(cfg *PipelineConfig) *batcher {
	return &batcher{
		source:     cfg.Source,
		maxChanges: cfg.MaxBatchChanges,
		maxBytes:   cfg.MaxBatchBytes,
		delay:      cfg.MaxDelay,
		batch:      &Batch{Source: cfg.Source},
	}
}

// add appends a chunk's changes, watermarks and commit position to the
// batch in hand. It reports whether the batch must be cut now.
func (b *batcher) add(ch *Chunk) (cut bool) {
	if len(b.batch.Changes) == 0 && len(ch.Changes) > 0 {
		b.arm()
	}
	b.batch.Changes = append(b.batch.Changes, ch.Changes...)
	b.bytes += ch.Bytes()
	b.batch.Watermarks = append(b.batch.Watermarks, ch.Watermarks...)
	if !ch.Commit.IsZero() {
		b.batch.Checkpoint = ch.Commit
	}
	b.atCommit = !ch.Commit.IsZero()
	n := len(b.batch.Changes)
	full := n >= b.maxChanges || b.bytes >= b.maxBytes
	if (full && !ch.Commit.IsZero()) || n >= 2*b.maxChanges || b.bytes >= 2*b.maxBytes {
		return true
	}
	if n == 0 && !ch.Commit.IsZero() && len(ch.Watermarks) == 0 {
		// Only positions moved: record them at the next delay tick.
		b.arm()
	}
	return false
}

// whole reports whether the batch in hand has changes and ends at a
// commit: it may be applied now without cutting a transaction.
func (b *batcher) whole() bool {
	return len(b.batch.Changes) > 0 && b.atCommit
}

// arm starts the delay timer unless it runs.
func (b *batcher) arm() {
	if b.timer == nil {
		b.timer = time.NewTimer(b.delay)
	}
}

// expired returns the delay timer's channel; nil (never ready) when it is
// not armed.
func (b *batcher) expired() <-chan time.Time {
	if b.timer == nil {
		return nil
	}
	return b.timer.C
}

// disarm stops the delay timer.
func (b *batcher) disarm() {
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
}

// take returns the batch in hand and starts an empty one.
func (b *batcher) take() *Batch {
	b.disarm()
	out := b.batch
	b.batch = &Batch{Source: b.source}
	b.bytes = 0
	b.atCommit = false
	return out
}

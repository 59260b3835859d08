package tidemark

import (
	"context"
)

// Chunk is a piece of a source's change stream: changes in commit order and,
// when the chunk ends a source transaction, the position just after it.
// A source splits a transaction larger than its chunk limit into several
// chunks; only the last carries Commit.
type Chunk struct {
	Changes []Change
	// Commit is the position after the transaction the chunk ends, or the
	// zero Position when the transaction continues in the next chunk.
	Commit Position
	// Watermarks to record once this chunk is applied (catch-up reads).
	Watermarks []Watermark
	// DDL holds the schema changes of the chunk's transaction, which take
	// effect before its Changes (see DDLEvent). A source puts them in the
	// first chunk of the transaction.
	DDL []DDLEvent
}

// Bytes returns the estimated size of the chunk's changes.
func (c *Chunk) Bytes() int {
	n := 0
	for i := range c.Changes {
		n += c.Changes[i].Size
	}
	return n
}

// Source streams a source's changes.
type Source interface {
	// Stream sends chunks, starting just after from, to out until ctx is
	// done or an error occurs. It retries transient errors itself and
	// returns ErrPositionPurged (not retried) when from is gone from the
	// source, ErrPositionAhead when from is ahead of it. It returns nil only
	// when ctx is done. Every chunk with a non-zero Commit ends a whole
	// source transaction.
	Stream(ctx context.Context, from Position, out chan<- Chunk) error
}

// Filter drops changes that cannot change the target (duplicates and
// regressions) before they reach a sink. It must never drop a change whose
// application would change the target.
type Filter interface {
	// Filter returns the changes to pass on, in order. It may reuse the
	// input slice.
	Filter(changes []Change) []Change
}

// Sink applies batches to a target.
type Sink interface {
	// Apply makes the batch's changes, its checkpoint (when not zero) and
	// its watermarks durable in one atomic commit: when Apply returns nil
	// all of them are committed; when it returns an error none of them is,
	// or the sink has verified (by reading its checkpoint back after an
	// ambiguous commit) that all of them are. Apply is idempotent: applying
	// a change whose version is not newer than the target row's is a no-op
	// counted as Skipped. Transient errors are retried inside Apply.
	Apply(ctx context.Context, b *Batch) (ApplyStats, error)
	// Checkpoint returns the position last committed for source, and
	// whether there is one.
	Checkpoint(ctx context.Context, source string) (Position, bool, error)
	// Close releases the sink's connections.
	Close() error
}

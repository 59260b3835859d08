package tidemark

import (
	"context"
	"time"
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

// Querier is the part of a database transaction that a CheckpointStore
// needs. Sinks adapt their driver's transaction to it so that checkpoints
// commit with the data.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) error
	QueryRow(ctx context.Context, sql string, args ...any) RowScanner
}

// RowScanner scans one result row; Scan returns ErrNoRows when there is none.
type RowScanner interface {
	Scan(dest ...any) error
}

// SourceState is what a CheckpointStore records for one source.
type SourceState struct {
	Position  Position
	UpdatedAt time.Time
}

// EpochFloorStore is implemented by a CheckpointStore that keeps, per
// source and apart from the checkpoint, the highest version epoch rows were
// written in (raised by SavePosition in the batch's transaction; a
// SavePosition below it fails with ErrEpochRegressed). A checkpoint deleted
// or edited by hand, or a start position, then cannot take the source back
// to an epoch whose changes would all lose to the target's rows
// (docs/FAILOVER.md).
type EpochFloorStore interface {
	// LoadEpochFloor returns the floor as a Position holding only Epoch
	// and Source (the server of that epoch), and whether one is stored.
	LoadEpochFloor(ctx context.Context, q Querier, source string) (Position, bool, error)
}

// CheckpointStore reads and writes positions and watermarks in the target,
// inside the caller's transaction.
type CheckpointStore interface {
	// Init creates the control tables if they are missing.
	Init(ctx context.Context, q Querier) error
	// LoadPosition returns the stored position of source and whether there
	// is one. A stored value that does not parse is an error naming the
	// table and source; nothing is written.
	LoadPosition(ctx context.Context, q Querier, source string) (Position, bool, error)
	// SavePosition stores pos for source.
	SavePosition(ctx context.Context, q Querier, source string, pos Position) error
	// LoadWatermark returns the stored catch-up watermark of a table.
	LoadWatermark(ctx context.Context, q Querier, source string, table TableID) (time.Time, bool, error)
	// SaveWatermark stores a table's watermark; it never moves it backwards.
	SaveWatermark(ctx context.Context, q Querier, source string, w Watermark) error
}

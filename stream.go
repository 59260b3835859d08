package tidemark

import (
	"context"
	"errors"
	"time"
)

// Scale-out (docs/SCALE-OUT.md): one tailer per source publishes changes to
// Kafka; a consumer group of appliers (`tidemark apply`) reads the change
// topics and applies them to PostgreSQL through the same version-guarded
// sink. An applier's position in each topic-partition is stored in the
// target, in the same transaction as the rows it applied.

// StreamOffset is an applier's position in one partition of a change topic,
// as stored in the target.
type StreamOffset struct {
	// Group is the consumer group of the appliers.
	Group string
	// Topic and Partition name the topic-partition.
	Topic     string
	Partition int32
	// Next is the offset of the next record to apply.
	Next int64
	// Schema is the table schema last announced on the partition (the
	// control record's JSON, opaque to the store): an applier that resumes
	// at Next needs it to decode the rows that follow. Empty when none.
	Schema string
	// TopicID is the topic's id (hex) when the offset was stored: a topic
	// deleted and created again under its name has another id, and its
	// offsets are not the stored ones. Empty when unknown.
	TopicID string
	// Floor is the newest version of a streamed change (not a snapshot
	// row) applied from the partition. Changes are published in source
	// order and a snapshot's rows before the stream they precede, so every
	// change of the partition older than Floor is applied: a hard-delete
	// tombstone older than every partition's Floor guards nothing any more
	// (TombstonePruner). Zero: none yet.
	Floor Version
	// Epoch is the leader epoch of the record before Next (-1: unknown):
	// an applier resumes with it so that a log truncated below Next (an
	// unclean leader election) is detected.
	Epoch int32
	// Prev is, when saving, the Next the saver last read or wrote for the
	// partition (-1: it found no row). The store refuses the save with
	// ErrOffsetMoved when the stored Next differs: another member applied
	// the partition meanwhile.
	Prev int64
}

// ErrOffsetMoved is returned (wrapped) when a stream offset changed in the
// target since the applier read it: the partition was reassigned and
// another member applied it. The batch is rolled back; the applier must
// drop the partition's in-flight records and re-read its offset.
var ErrOffsetMoved = errors.New("stream offset moved: another applier applied the partition")

// StreamTarget is what an applier writes to: a sink whose Apply also
// stores the batch's Offsets in the same transaction, that reads them back,
// and that creates or evolves a target table to an announced schema.
type StreamTarget interface {
	Sink
	// Offsets returns the stored offsets of group's partitions of topic.
	Offsets(ctx context.Context, group, topic string) ([]StreamOffset, error)
	// EnsureTable creates the target table of t if it is missing, or
	// brings an existing one to t's schema.
	EnsureTable(ctx context.Context, t *Table) error
	// TruncateBefore applies a source TRUNCATE of table at version v (at
	// commit, the source commit time) as one partition's applier sees it:
	// it removes every target row at v or older (a snapshot at v saw only
	// what came before the statement; see Version) and keeps newer
	// ones, so it is idempotent and may run once per partition, in any
	// order. A TRUNCATE the target's configuration refuses is a
	// *TableError wrapping ErrDDLRefused.
	TruncateBefore(ctx context.Context, table TableID, v Version, commit time.Time) error
	// DropBefore applies a source DROP TABLE of table at version v as one
	// partition's applier sees it: it removes every target row at v or
	// older, then drops the target table if no row is left (rows
	// of a table created again under the same name after the DROP are
	// newer and keep it). Like TruncateBefore it is idempotent and may run
	// once per partition, in any order; a lagging partition that writes
	// older rows after the first run recreates the table until it reaches
	// its own control record. A DROP the target's configuration refuses
	// is a *TableError wrapping ErrDDLRefused.
	DropBefore(ctx context.Context, table TableID, v Version) error
	// RemoveBefore applies the end of a snapshot of table whose rows were
	// stamped v, as one partition's applier sees it: the partition's rows
	// of the snapshot came before (written with Batch.Refresh, so each is
	// at v, or newer for a snapshot beside the stream: docs/SNAPSHOTS.md
	// "With Kafka"), so a target row older than v was not in the snapshot and is
	// gone from the source (v is above every change the snapshot saw and
	// below every change it did not: Snapshot). Every such row is
	// removed (soft-delete mode: marked deleted, keeping its version, so
	// that a snapshot row at v still wins over it). It is idempotent and may
	// run once per partition, in any order; it returns the number of rows
	// removed. A row of a partition that has not reached its own snapshot
	// rows yet is removed early and written again by them (a brief
	// regression that converges).
	RemoveBefore(ctx context.Context, table TableID, v Version) (int64, error)
}

// TombstonePruner is implemented by a StreamTarget that keeps hard-delete
// tombstones: PruneTombstones removes those of table older than below
// (the smallest StreamOffset.Floor over every partition of the table's
// topic), which no change still to be applied can be older than. It returns
// how many it removed.
type TombstonePruner interface {
	PruneTombstones(ctx context.Context, table TableID, below Version) (int64, error)
}

// SnapshotBoundary is implemented by sinks whose consumers apply a
// table's snapshot on their own, in order with its changes (the Kafka sink
// of the scale-out topology). Whoever snapshots a table into such a sink
// calls BeginSnapshot before the snapshot's first row and EndSnapshot after
// its last one: each consumer then removes the target rows the snapshot
// did not carry (StreamTarget.RemoveBefore), in order with the stream, so a
// resync also removes rows deleted from the source. A snapshot that fails
// between the two leaves no end mark: nothing is removed until it is run
// again.
type SnapshotBoundary interface {
	// BeginSnapshot marks where the rows of a snapshot of table start.
	BeginSnapshot(ctx context.Context, source string, table TableID, reason string) error
	// EndSnapshot marks where they end: every row of the snapshot, stamped
	// v (a snapshot beside the stream: v is its first chunk's version, and
	// each chunk's rows are stamped with its own capture's, not older), is
	// before it.
	EndSnapshot(ctx context.Context, source string, table TableID, v Version) error
}

package tidemark

import (
	"context"
	"time"
)

// Snapshot is a consistent starting point for a catch-up: the source
// position captured before anything is read, the version every row read
// after it is stamped with, and the source server's clock at capture.
//
// A row read after the capture may already reflect changes committed after
// it; it is stamped with Version, which lies strictly between the rows of
// the last transaction the capture saw and those of the first one it did
// not (Index 0; Seq = the last GTID sequence + 1 under version: gtid, the
// captured offset, where the next transaction starts, under filepos), so
// every binlog change after the capture is newer and is applied over it when
// streaming resumes at Position, and every change the capture saw is older
// (a table's Floor skips it). A row can therefore briefly show an older
// state until the replay reaches its last change: a temporary regression
// that always converges, because the replay starts at the captured position.
type Snapshot struct {
	Position Position
	Version  Version
	// ServerTime is the source clock (UTC) at capture.
	ServerTime time.Time
}

// ReadRequest asks a SnapshotSource for one chunk of a table.
type ReadRequest struct {
	Table TableID
	// Column is the watermark column; empty means a full read of the table
	// in business-key order.
	Column string
	// Lower (exclusive) and Upper (inclusive) bound Column, in UTC; a zero
	// Lower is unbounded. Ignored when Column is empty.
	Lower, Upper time.Time
	// Undated, with Column, reads instead the rows whose Column has no time
	// to bound it (NULL or a zero date), in business-key order: no window
	// selects them, so every catch-up window reads them again. Lower and
	// Upper are ignored.
	Undated bool
	// After is the cursor returned by the previous chunk (nil to start).
	After []any
	// Limit is the chunk size in rows.
	Limit int
	// Snapshot stamps the rows read (version and commit time).
	Snapshot Snapshot
	// KeyFrom (exclusive) and KeyTo (inclusive), one value each when set,
	// bound the first key column of a full read (no Column): one range of
	// a parallel snapshot (SnapshotRange).
	KeyFrom, KeyTo []any
}

// KeySplitter is a SnapshotSource that can divide a table for a parallel
// snapshot.
type KeySplitter interface {
	// KeySplits returns up to n-1 ascending distinct values of the
	// table's first key column that cut it into up to n ranges of about
	// equal size (none: one range).
	KeySplits(ctx context.Context, table TableID, n int) ([]any, error)
}

// SplitRanges turns KeySplits' values into the ranges they bound.
func SplitRanges(splits []any) []SnapshotRange {
	out := make([]SnapshotRange, 0, len(splits)+1)
	var from []any
	for _, v := range splits {
		out = append(out, SnapshotRange{From: from, To: []any{v}})
		from = []any{v}
	}
	return append(out, SnapshotRange{From: from})
}

// ReadResult is one chunk of rows as OpRead changes.
type ReadResult struct {
	Changes []Change
	// Next is the cursor of the next chunk, or nil when the read is done.
	Next []any
}

// SnapshotSource reads a source's tables with bounded SQL queries, with
// values normalized exactly like its binlog changes.
type SnapshotSource interface {
	// Capture records the position to resume streaming from; call it
	// before reading anything.
	Capture(ctx context.Context) (Snapshot, error)
	// Tables lists the tables the source replicates.
	Tables(ctx context.Context) ([]TableID, error)
	// Table returns a table's schema as Read decodes it.
	Table(ctx context.Context, table TableID) (*Table, error)
	// MaxTime returns MAX(column) of a table in UTC, and false when the
	// table has no non-NULL value.
	MaxTime(ctx context.Context, table TableID, column string) (time.Time, bool, error)
	// CountAbove counts the rows whose column is after t (UTC).
	CountAbove(ctx context.Context, table TableID, column string, t time.Time) (int64, error)
	// Read returns one chunk.
	Read(ctx context.Context, req ReadRequest) (ReadResult, error)
	// KeyChunk returns up to limit business keys after the cursor, in key
	// order, and a checksum of them that a KeyTarget computes identically.
	KeyChunk(ctx context.Context, table TableID, after []any, limit int) (KeyChunk, error)
	// KeyRangeSum computes the checksum of the keys in (after, upTo].
	KeyRangeSum(ctx context.Context, table TableID, after, upTo []any) (KeySum, error)
}

// KeySum is an order-independent checksum of a set of business keys: their
// count and the sum of a 60-bit hash of each key's canonical text, as a
// decimal string (it can exceed 64 bits).
type KeySum struct {
	Count int64
	Sum   string
}

// KeyChunk is one chunk of a key listing.
type KeyChunk struct {
	// Keys are the business-key values, in key order.
	Keys [][]any
	// Last is the last key of the chunk (the cursor for the next one), nil
	// when the listing is exhausted.
	Last []any
	// Sum is the checksum of Keys.
	Sum KeySum
}

// KeyTarget is the target side of a key diff.
type KeyTarget interface {
	// KeyRangeSum computes the checksum of the target's keys of table in
	// (after, upTo] (after nil = from the start, upTo nil = to the end),
	// in the same canonical form as the SnapshotSource.
	KeyRangeSum(ctx context.Context, table *Table, after, upTo []any) (KeySum, error)
	// KeysInRange lists the target's keys in (after, upTo].
	KeysInRange(ctx context.Context, table *Table, after, upTo []any) ([][]any, error)
}

// TargetRows is implemented by targets that can tell whether they hold any
// row of a table. A catch-up into a table the target holds no row of cannot
// have missed a hard delete (there is nothing to delete): it does not warn.
type TargetRows interface {
	HasRows(ctx context.Context, table *Table) (bool, error)
}

// TargetIdentity is implemented by targets that can name the physical table
// holding a table's rows. A first run records it with its progress, and a
// resumed first run trusts that progress only while the identity is the
// same: a target table dropped and created again, truncated or rewritten
// since has another (or none, exists false), and the rows the progress
// counts may be gone.
type TargetIdentity interface {
	TargetIdentity(ctx context.Context, table TableID) (id string, exists bool, err error)
}

// WatermarkStore reads the per-table catch-up watermarks a sink stores.
type WatermarkStore interface {
	Watermark(ctx context.Context, source string, table TableID) (time.Time, bool, error)
}

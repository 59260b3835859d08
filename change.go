// Package tidemark holds the domain of the tidemark change-data-capture daemon:
// changes, table schemas, source positions and versions, batches, and the small
// interfaces between the pipeline stages (Source → Filter → Sink).
//
// It imports only the standard library. Subpackages implement these
// interfaces (binlog, dedupe, fallback, sink/postgres, sink/kafka,
// checkpoint) and never import each other; cmd/tidemark and integration wire
// them together.
package tidemark

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Op is the kind of a change.
type Op uint8

const (
	// OpInsert is a row inserted in the source.
	OpInsert Op = iota + 1
	// OpUpdate is a row updated in the source; Before and After are set.
	OpUpdate
	// OpDelete is a row deleted in the source; only Before is set.
	OpDelete
	// OpRead is a row read by a snapshot or catch-up query (not the binlog).
	// A sink treats it as an upsert.
	OpRead
)

// String returns the single-letter code used in envelopes: c, u, d or r.
func (o Op) String() string {
	switch o {
	case OpInsert:
		return "c"
	case OpUpdate:
		return "u"
	case OpDelete:
		return "d"
	case OpRead:
		return "r"
	}
	return "op(" + strconv.Itoa(int(o)) + ")"
}

// Version orders the changes of one source. It is what the sinks' "only if
// newer" guard compares.
//
// The choice (see docs/DESIGN-DECISIONS.md and binlog.versionOf):
//   - MariaDB: Seq is the GTID sequence number of the transaction in the
//     source's replication domain. With gtid_strict_mode the sequence grows
//     monotonically within a domain, also across a failover to a replica that
//     keeps the same domain, which file/position does not.
//   - MySQL (and MariaDB when configured with version: filepos): Seq is
//     fileIndex<<40 | offset of the transaction's first event; it orders the
//     changes of one server's binlog but not across a failover.
//
// Index is the 1-based ordinal of the row change inside its transaction, so a
// key changed twice in one transaction gets two ordered versions. Index 0 is
// reserved for rows read by a snapshot or catch-up query (and for DDL
// events, which have no rows): a snapshot's version (Snapshot.Version) is
// above every change the read saw and below every change it did not, and a
// replay of an already-applied transaction carries the same version and is
// a no-op. A DDL event of transaction T is at (T, 0), the same version as a
// snapshot that saw everything before T: the statement comes after it.
type Version struct {
	Seq   uint64
	Index uint32
}

// Compare returns -1, 0 or +1 as v is older than, equal to, or newer than o.
func (v Version) Compare(o Version) int {
	switch {
	case v.Seq < o.Seq:
		return -1
	case v.Seq > o.Seq:
		return 1
	case v.Index < o.Index:
		return -1
	case v.Index > o.Index:
		return 1
	}
	return 0
}

// String formats the version as "seq.index".
func (v Version) String() string {
	return strconv.FormatUint(v.Seq, 10) + "." + strconv.FormatUint(uint64(v.Index), 10)
}

// Change is one row change of a source table, with values normalized: every
// DATETIME/TIMESTAMP is a UTC time.Time (see Value kinds in schema.go).
type Change struct {
	// Op is what happened to the row.
	Op Op
	// Table is the schema the row was written with (from the binlog's
	// table-map metadata or the catch-up query), shared between changes.
	Table *Table
	// Before is the row image before the change (updates and deletes);
	// After is the image after it (inserts, updates, reads). Both are
	// positional over Table.Columns.
	Before, After []any
	// Version orders this change against every other change of the source.
	Version Version
	// CommitTime is the source commit time in UTC (1 s resolution for the
	// binlog header).
	CommitTime time.Time
	// Size is an estimate of the change's memory in bytes, used for
	// byte-bounded batching and back-pressure.
	Size int
	// KeyOnly marks a delete whose Before image holds only the business
	// key (its other values are unknown, not NULL): a row a key diff found
	// gone from the source. A sink that keeps deleted rows keeps the last
	// image it has of them.
	KeyOnly bool
}

// Row returns the image that identifies the row: After, or Before for a
// delete.
func (c *Change) Row() []any {
	if c.Op == OpDelete || c.After == nil {
		return c.Before
	}
	return c.After
}

// Key returns the business key of the change (for an update that changes the
// key, the new key; see KeyBefore).
func (c *Change) Key() Key {
	return c.Table.KeyOf(c.Row())
}

// KeyBefore returns the business key of the Before image, or "" if there is
// none.
func (c *Change) KeyBefore() Key {
	if c.Before == nil {
		return ""
	}
	return c.Table.KeyOf(c.Before)
}

// Key is a canonical, comparable encoding of a business key's values; equal
// keys of one table encode equally. It is meant for maps, not for display.
type Key string

// KeyOf encodes the business-key columns of row.
func (t *Table) KeyOf(row []any) Key {
	// A single integer key, the common case, without a builder.
	if len(t.Key) == 1 && t.Key[0] < len(row) {
		switch x := row[t.Key[0]].(type) {
		case int64:
			var buf [32]byte
			return Key(strconv.AppendInt(append(buf[:0], "\x01V"...), x, 10))
		case uint64:
			var buf [32]byte
			return Key(strconv.AppendUint(append(buf[:0], "\x01V"...), x, 10))
		}
	}
	var b strings.Builder
	for i, ci := range t.Key {
		if i > 0 {
			b.WriteByte(0)
		}
		if ci < len(row) {
			writeKeyPart(&b, row[ci])
		}
	}
	return Key(b.String())
}

func writeKeyPart(b *strings.Builder, v any) {
	switch x := v.(type) {
	case nil:
		b.WriteString("\x01N")
	case []byte:
		b.WriteString("\x01B")
		b.WriteString(strconv.Itoa(len(x)))
		b.WriteByte(':')
		b.Write(x)
	case string:
		b.WriteString("\x01S")
		b.WriteString(strconv.Itoa(len(x)))
		b.WriteByte(':')
		b.WriteString(x)
	case time.Time:
		b.WriteString("\x01T")
		b.WriteString(strconv.FormatInt(x.UnixMicro(), 10))
	case int64:
		var buf [24]byte
		b.WriteString("\x01V")
		b.Write(strconv.AppendInt(buf[:0], x, 10))
	case uint64:
		var buf [24]byte
		b.WriteString("\x01V")
		b.Write(strconv.AppendUint(buf[:0], x, 10))
	case Decimal:
		b.WriteString("\x01V")
		b.WriteString(string(x))
	default:
		fmt.Fprintf(b, "\x01V%v", x)
	}
}

// Batch is a unit of work for a sink: changes in commit order and the
// position to record with them.
type Batch struct {
	// Source names the source the changes come from (the checkpoint row).
	Source string
	// Changes in source commit order.
	Changes []Change
	// Checkpoint is the position just after the last whole source
	// transaction in Changes. It is the zero Position when the batch holds
	// only part of a transaction that is larger than a batch: the stored
	// checkpoint then stays at the previous boundary until the last part
	// commits, and a crash replays the transaction idempotently (its parts
	// are briefly visible half-applied in the target).
	Checkpoint Position
	// Watermarks to store with the batch (fallback catch-up), by table.
	Watermarks []Watermark
	// Offsets are the stream offsets to store with the batch (an applier
	// reading change topics; see StreamTarget). A sink that cannot store
	// them fails the batch.
	Offsets []StreamOffset
	// Refresh makes a row read by a snapshot (OpRead, index 0) replace
	// an older target row even when its values are the same, so that the
	// row carries the snapshot's version: the end of a snapshot
	// (StreamTarget.RemoveBefore) tells the rows the snapshot carried by
	// it. Without Refresh an unchanged row keeps its version and is not
	// written (re-reading a window is a no-op).
	Refresh bool
	// FreshLoad marks the rows of a first run's snapshot of a table whose
	// target held no rows when the read began (and needs no key diff):
	// every target row is the run's own, read after its one capture. A
	// sink may then create the target table without its primary key,
	// insert the rows without the per-row index maintenance, and build
	// the key after the load (IndexMirror.MirrorIndexes); rows a killed
	// run's chunks wrote twice (a chunk applied again after a restart)
	// are doubles of one source row with the same version, and the
	// key's build keeps one of each. Any batch without it (the stream, a
	// catch-up, a resync) finds the key built first.
	FreshLoad bool
}

// Watermark is a per-table catch-up watermark: every source row with a
// watermark-column value at or below Value (UTC) has been applied.
type Watermark struct {
	Table TableID
	Value time.Time
}

// Bytes returns the estimated size of the batch's changes.
func (b *Batch) Bytes() int {
	n := 0
	for i := range b.Changes {
		n += b.Changes[i].Size
	}
	return n
}

// ApplyStats counts what a sink did with a batch. Inserted + Updated +
// Deleted + Skipped equals the number of changes the sink applied (after
// coalescing: Coalesced counts the changes merged into another change of the
// same key in the batch, so Inserted+Updated+Deleted+Skipped+Coalesced equals
// len(Batch.Changes)). A mismatch is a bug and is reported as an error.
type ApplyStats struct {
	Inserted, Updated, Deleted, Skipped, Coalesced int
}

// Total returns Inserted + Updated + Deleted + Skipped + Coalesced.
func (s ApplyStats) Total() int {
	return s.Inserted + s.Updated + s.Deleted + s.Skipped + s.Coalesced
}

// Add adds o to s.
func (s *ApplyStats) Add(o ApplyStats) {
	s.Inserted += o.Inserted
	s.Updated += o.Updated
	s.Deleted += o.Deleted
	s.Skipped += o.Skipped
	s.Coalesced += o.Coalesced
}

package tidemark

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Schema changes and per-table state (see docs/schema-changes.md).
//
// A source's tables are replicated independently. Each has a TableMode,
// recorded in the target next to the checkpoint (a TableRegistry), so that
// it survives a restart:
//
//	streaming     changes are applied; those older than TableState.Floor are
//	              skipped (the table was snapshotted at Floor)
//	quarantined   changes are skipped: an incompatible schema change, a
//	              refused DROP TABLE or TRUNCATE, or rows the source cannot
//	              decode. Only a resync brings the table back.
//	resync        a resync was requested (tidemark resync --table); the
//	              daemon performs it, changes are skipped until then
//	snapshotting  the table is being re-snapshotted (new table, resync,
//	              backfill after ALTER TABLE); a start that finds this mode
//	              redoes the snapshot
//
// Skipping is final: once the checkpoint has moved past a skipped change it
// is never streamed again. The way back from quarantine is a new snapshot of
// the table (Resnapshot), after which the stream resumes with the changes
// newer than the snapshot.

// Schema-change errors.
var (
	// ErrIncompatibleSchema means a table's new schema cannot be applied to
	// its target without losing or misaligning data (a narrowed type, a new
	// primary key, a type change the target cannot follow losslessly). The
	// table is quarantined.
	ErrIncompatibleSchema = errors.New("incompatible schema change")
	// ErrDDLRefused means the configuration refuses a DDL statement of the
	// source (ddl.drop_table or ddl.truncate: refuse). The table is
	// quarantined.
	ErrDDLRefused = errors.New("DDL refused by configuration")
	// ErrUndecodable means the source cannot decode a table's rows (no
	// primary key, an unsupported type, an invalid column name...). The
	// table is quarantined.
	ErrUndecodable = errors.New("table rows cannot be decoded")
	// ErrHeldConstraint marks a *TableError of a constraint a load left
	// waiting for the stream (IndexMirrorAfter) that fails when a batch
	// past the load's high watermark builds it: the table is quarantined
	// even when the batch holds none of its changes.
	ErrHeldConstraint = errors.New("a unique constraint held since a load fails once the stream passed the load's high watermark")
	// ErrLayoutChanged means a snapshot read found the table's columns
	// of another type than the layout it read before (an ALTER between
	// the two): the rows are not decoded with the older layout, and the
	// read restarts with the layout read again.
	ErrLayoutChanged = errors.New("the table's layout changed since it was read")
)

// TableError is an error confined to one table that retrying cannot fix.
// A Pipeline that gets one from its sink quarantines the table and carries
// on with the other tables; sinks return it only for that purpose.
type TableError struct {
	Table TableID
	Err   error
}

// Error implements error.
func (e *TableError) Error() string { return "table " + e.Table.String() + ": " + e.Err.Error() }

// Unwrap returns the cause.
func (e *TableError) Unwrap() error { return e.Err }

// DDLOp is the kind of a DDLEvent.
type DDLOp uint8

// The DDL operations a source reports.
const (
	// DDLCreateTable: the table was created (or re-created, or renamed
	// from DDLEvent.From). A created table is streamed from here: its
	// rows all follow in the stream. A renamed one brings rows the stream
	// never showed under its name: the pipeline snapshots it when the
	// target does not hold it yet.
	DDLCreateTable DDLOp = iota + 1
	// DDLDropTable: the table was dropped (or renamed away; Reason says).
	DDLDropTable
	// DDLTruncate: every row of the table was removed.
	DDLTruncate
	// DDLAlterTable: the table was altered. Column types, order and the key
	// are taken from the next row's schema; the event carries what a row
	// schema cannot show: renames, and whether existing rows got values the
	// binlog does not carry (Backfill).
	DDLAlterTable
	// DDLUndecodable: the source cannot decode the table's rows (Reason
	// says why); the table is quarantined.
	DDLUndecodable
)

var ddlOpNames = map[DDLOp]string{DDLCreateTable: "CREATE TABLE", DDLDropTable: "DROP TABLE", DDLTruncate: "TRUNCATE",
	DDLAlterTable: "ALTER TABLE", DDLUndecodable: "undecodable rows"}

// String returns the statement the op stands for.
func (o DDLOp) String() string {
	if s, ok := ddlOpNames[o]; ok {
		return s
	}
	return "ddl(" + strconv.Itoa(int(o)) + ")"
}

// ColumnRename is one column renamed by ALTER TABLE.
type ColumnRename struct{ From, To string }

// DDLEvent is a schema change of one source table, in stream order. A
// source sends it in Chunk.DDL; it takes effect before the chunk's changes.
type DDLEvent struct {
	Op    DDLOp
	Table TableID
	// Version is the version of the source transaction (Index 0).
	Version Version
	// Renames, Dropped and Added list the columns an ALTER TABLE renamed,
	// dropped and added, in statement order.
	Renames []ColumnRename
	Dropped []string
	Added   []string
	// Backfill is set when the ALTER gave existing rows values that the
	// binlog does not carry (ADD COLUMN with a default, NOT NULL, a
	// generated column, AUTO_INCREMENT): the table is re-snapshotted.
	Backfill bool
	// Reason explains a DDLUndecodable or a DDLDropTable that comes from a
	// rename.
	Reason string
	// From is, for a DDLCreateTable that comes from a rename, the table's
	// old name (zero otherwise).
	From TableID
	// IndexesRead is set on a DDLAlterTable (ALTER TABLE, CREATE INDEX,
	// DROP INDEX) when the source read the table's secondary indexes
	// after the statement: Indexes then holds them, and a sink that
	// mirrors indexes follows them. The catalog is read when the event
	// is streamed, so a replayed event carries the indexes of now (a
	// later event of the replay carries the same): the mirror converges
	// on the source's current indexes.
	IndexesRead bool
	Indexes     []Index
}

// String describes the event for log lines (never any value).
func (e DDLEvent) String() string {
	s := e.Op.String() + " " + e.Table.String()
	if e.Reason != "" {
		s += " (" + e.Reason + ")"
	}
	return s
}

// TableMode is the replication state of one table.
type TableMode string

// The table modes.
const (
	TableStreaming       TableMode = "streaming"
	TableQuarantined     TableMode = "quarantined"
	TableResyncRequested TableMode = "resync"
	TableSnapshotting    TableMode = "snapshotting"
)

// Valid reports whether m is one of the table modes.
func (m TableMode) Valid() bool {
	switch m {
	case TableStreaming, TableQuarantined, TableResyncRequested, TableSnapshotting:
		return true
	}
	return false
}

// TableState is the recorded state of one source table.
type TableState struct {
	Table TableID
	Mode  TableMode
	// Reason says why the table is not streaming (or why it was last
	// snapshotted). It never holds a value.
	Reason string
	// Floor is the version the table was last snapshotted at: changes with
	// an older version are already in the snapshot and are skipped. Zero
	// means none.
	Floor Version
	// Cursor, while a snapshot beside the stream is in progress (mode
	// snapshotting), is the chunk cursor after the last chunk applied
	// (EncodeCursor), and Floor the version of the snapshot's first chunk:
	// a restart resumes the snapshot after it. Empty otherwise.
	Cursor string
	// UpdatedAt is the target's clock when the state was recorded.
	UpdatedAt time.Time
}

// Skips reports whether the pipeline skips a change of this table with
// version v.
func (s *TableState) Skips(v Version) bool {
	return s.Mode != TableStreaming || v.Compare(s.Floor) < 0
}

// TableRegistry is implemented by sinks that keep table states. Methods
// that the sink's configuration cannot support return an error wrapping
// errors.ErrUnsupported; a Pipeline then keeps the states in memory only.
type TableRegistry interface {
	// TableStates returns the recorded states of source's tables.
	TableStates(ctx context.Context, source string) ([]TableState, error)
	// SetTableState records one table's state.
	SetTableState(ctx context.Context, source string, st TableState) error
	// SwapTableState records st only if the table's recorded state has
	// mode old (old "": no state is recorded), in one statement, and
	// reports whether it did: a state another process recorded meanwhile
	// (a resync tidemark resync asked for) is not overwritten.
	SwapTableState(ctx context.Context, source string, old TableMode, st TableState) (bool, error)
	// HasTable reports whether the target already holds a table for the
	// source table.
	HasTable(ctx context.Context, table TableID) (bool, error)
	// ResetTable drops the target table and the table's catch-up
	// watermark, before a new snapshot.
	ResetTable(ctx context.Context, source string, table TableID) error
	// EnsureTable creates the target table of t if it is missing, or
	// brings an existing one to t's schema like Apply does (a snapshot of
	// an empty table creates its target this way).
	EnsureTable(ctx context.Context, t *Table) error
}

// DDLSink is implemented by sinks that follow DDL.
type DDLSink interface {
	// ApplyDDL applies the events in order and stores checkpoint (when not
	// zero) in one atomic commit. An event that the sink's configuration
	// refuses (ErrDDLRefused) or that it cannot apply is returned as a
	// *TableError and nothing is committed. A DDLDropTable that is applied
	// also forgets the table's state.
	ApplyDDL(ctx context.Context, source string, events []DDLEvent, checkpoint Position) error
}

// SourceLocker is implemented by sinks that can hold an exclusive lock per
// source, so that one daemon at a time streams a source and commands can
// tell whether one is running.
type SourceLocker interface {
	// TryLockSource takes the source's lock without waiting. ok is false
	// when another session holds it. release gives it back; it is held
	// until then (or until the sink's connection is lost).
	TryLockSource(ctx context.Context, source string) (release func(), ok bool, err error)
}

// SourceLockChecker is implemented by a SourceLocker whose lock can end
// while it is held: a session lock ends with its session, which the server
// may end on its own (idle_session_timeout, pg_terminate_backend, a
// restart, a failover, a pooler). Pipeline.Run calls CheckSourceLock every
// PipelineConfig.LockCheckInterval:
//
//   - nil, false: the lock TryLockSource took for source is still held;
//   - nil, true: its session had ended and the lock was free, so it was
//     taken again on a new session (Run then proves from the checkpoint
//     that no other process wrote meanwhile, or stops);
//   - an error wrapping ErrSourceLockLost: another session holds the lock
//     (a standby took it): Run stops, since two writers of one source are
//     not safe;
//   - any other error: the lock could not be checked (the server does not
//     answer); Run keeps checking, and nothing it writes commits meanwhile.
type SourceLockChecker interface {
	CheckSourceLock(ctx context.Context, source string) (retaken bool, err error)
}

// ErrSourceLockLost is returned (wrapped) by Pipeline.Run when its source's
// lock ended while it streamed.
var ErrSourceLockLost = errors.New("lost the source lock")

// WriterCheckable is implemented by a Source whose server can end its
// stream for another client (ErrServerIDInUse): a standby that took the
// source's lock over registers with the same replica server_id and ends
// the stream of the process it took over from. When the sink is a
// SourceLockChecker, Pipeline.Run hands the source a check before it
// streams, which checks the lock at once, as the periodic check does:
//
//   - nil: this process holds the lock, and if it had to take it again,
//     no other process wrote while it was free: the source may take its
//     id back (reconnect), since no other process may stream as a writer;
//   - an error wrapping ErrSourceLockLost: another process holds the lock
//     (Run stops with that error; the source stops streaming);
//   - any other error: the lock could not be checked (nothing is proven).
//
// Without a check (no lock) a source stops with ErrServerIDInUse.
type WriterCheckable interface {
	SetWriterCheck(check func(ctx context.Context) error)
}

// Activator is implemented by sinks whose writing needs a takeover step
// that disturbs any other instance writing for the same source: the Kafka
// sink's transactional producer, whose initialization fences every older
// producer with the same transactional id and finishes the transaction it
// left open. Such a sink does nothing of the kind until Activate (or its
// first Apply), so that commands that only read (checkpoint, status, a
// resync request) and a standby daemon waiting for the source's lock never
// disturb the active daemon. Pipeline.Run activates its sink once it holds
// the source's lock and before it reads the checkpoint.
type Activator interface {
	// Activate takes over writing for the sink's sources. It is
	// idempotent; a sink that was fenced by a newer instance returns the
	// fencing error.
	Activate(ctx context.Context) error
}

// SnapshotFunc snapshots some tables of a source without moving the
// checkpoint and returns the version the rows were stamped with: every
// change of those tables older than it is in the snapshot. The daemon wires
// it to the fallback catch-up (fallback.CatchUp.RunReport).
type SnapshotFunc func(ctx context.Context, tables []TableID) (Version, error)

// Resnapshot takes a table through a new snapshot: it records the table as
// snapshotting (reason says why), drops its target table and watermark,
// snapshots it, and records it as streaming from the snapshot's version.
// A crash in between leaves the table snapshotting; the next start of the
// pipeline calls Resnapshot again. It returns the final state. An error
// of the registry (recording the state, dropping the target) is told apart
// from an error of the snapshot itself by IsRegistryError. A registry that
// is a SnapshotBoundary gets BeginSnapshot after the reset and EndSnapshot
// with the snapshot's version after the rows (errors of either count as
// the registry's).
func Resnapshot(ctx context.Context, reg TableRegistry, source string, id TableID, snapshot SnapshotFunc, reason string) (TableState, error) {
	st := TableState{Table: id, Mode: TableSnapshotting, Reason: reason}
	if err := reg.SetTableState(ctx, source, st); err != nil {
		return st, &storeError{fmt.Errorf("resnapshot %s: %w", id, err)}
	}
	if err := reg.ResetTable(ctx, source, id); err != nil {
		var te *TableError
		if errors.As(err, &te) {
			// The table's own problem (a name the target cannot hold:
			// a gh-ost table renamed in under a longer name), not the
			// registry's: the caller quarantines it.
			return st, fmt.Errorf("resnapshot %s: %w", id, err)
		}
		return st, &storeError{fmt.Errorf("resnapshot %s: %w", id, err)}
	}
	// A registry whose consumers apply the snapshot on their own (the
	// scale-out tailer) encloses its rows in boundaries: at the end each
	// consumer removes the rows the snapshot did not carry.
	boundary, _ := reg.(SnapshotBoundary)
	if boundary != nil {
		if err := boundary.BeginSnapshot(ctx, source, id, reason); err != nil {
			return st, &storeError{fmt.Errorf("resnapshot %s: begin: %w", id, err)}
		}
	}
	v, err := snapshot(ctx, []TableID{id})
	if err != nil {
		return st, fmt.Errorf("resnapshot %s: %w", id, err)
	}
	if boundary != nil {
		if err := boundary.EndSnapshot(ctx, source, id, v); err != nil {
			return st, &storeError{fmt.Errorf("resnapshot %s: end: %w", id, err)}
		}
	}
	st = TableState{Table: id, Mode: TableStreaming, Reason: reason, Floor: v}
	if err := reg.SetTableState(ctx, source, st); err != nil {
		return st, &storeError{fmt.Errorf("resnapshot %s: %w", id, err)}
	}
	return st, nil
}

// storeError marks an error of a TableRegistry inside Resnapshot.
type storeError struct{ err error }

func (e *storeError) Error() string { return e.err.Error() }
func (e *storeError) Unwrap() error { return e.err }

// IsRegistryError reports whether an error of Resnapshot came from the
// registry (the target) rather than from the snapshot of the table.
func IsRegistryError(err error) bool {
	var se *storeError
	return errors.As(err, &se)
}

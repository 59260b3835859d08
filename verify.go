package tidemark

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Verification: the types and interfaces between the verify package (the
// engine behind `tidemark verify` and the demo), the source side (binlog,
// MariaDB SQL) and the target side (sink/postgres, PostgreSQL SQL). Both
// sides compute the same canonical text for every row inside their own
// database, so only counts, 64-bit checksums and — for chunks that differ —
// keys and row hashes cross the network. The canonical forms are documented
// in docs/verify.md and in CanonicalForms below.

// ErrDuplicateKeys means the target holds more than one row for a business
// key: a violation of the invariant the post-load assertion guards.
var ErrDuplicateKeys = errors.New("duplicate business keys in target")

// Canonical forms: the text both sides produce per kind. The row hash is
// the first 64 bits of the SHA-256 of the values in column order joined by "|",
// each value its canonical text — as "<byte length>:<text>" for the
// free-form kinds (LengthPrefixed) — and NULL as "N". The fixed-format
// texts (digits, signs, '.', ':', ' ', '-', hex) never hold "|" or "N", and
// a length prefix says where a free-form text ends, so the encoding is
// unambiguous without measuring every value (which the databases would do
// by computing it twice).
//
//	int, uint, year   decimal digits ("-12", "0")
//	bit               the unsigned value in decimal digits
//	decimal           digits with the declared scale ("12.30")
//	text, enum, set   the UTF-8 text
//	bytes             lower-case hex
//	date              YYYY-MM-DD
//	datetime          YYYY-MM-DD HH:MM:SS.ffffff, the wall clock in the
//	                  column's source zone (the target converts its UTC
//	                  instant back with AT TIME ZONE)
//	timestamp         YYYY-MM-DD HH:MM:SS.ffffff in UTC
//	time              signed total microseconds
//	float, double     not hashed in SQL: compared in Go (see GoCompared)
//	json              not hashed in SQL: compared in Go as canonical JSON
//
// A zero date on the source is NULL (as the tailer writes it with
// zero_dates: null).

// LengthPrefixed reports whether the canonical text of kind k is free-form
// (any character may appear) and so is written with its byte length in the
// row hash's input.
func LengthPrefixed(k Kind) bool {
	return k == KindText || k == KindEnum || k == KindSet
}

// GoCompared reports whether values of kind k are left out of the
// in-database row hash and compared in Go instead: the two databases print
// floats differently (MariaDB prints FLOAT with 6 significant digits) and
// have no common canonical JSON text.
func GoCompared(k Kind) bool {
	return k == KindFloat || k == KindDouble || k == KindJSON
}

// RangeKey reports whether a business-key column of kind k can bound a
// chunk: both databases must order its values the same way. Text-like keys
// are ordered by their UTF-8 bytes on both sides (MariaDB's
// case-insensitive collations are bypassed, see docs/verify.md).
func RangeKey(k Kind) bool {
	switch k {
	case KindInt, KindUint, KindYear, KindDecimal, KindDate, KindDateTime, KindTimestamp,
		KindText, KindEnum, KindSet, KindBytes:
		return true
	}
	return false
}

// VerifySpec is what both sides of a verification need to know about one
// table. It is built by the verify package from the source's current
// schema and its config.
type VerifySpec struct {
	// Table is the source table: columns, kinds and business key.
	Table *Table
	// TargetSchema is the PostgreSQL schema of the target table (its name
	// is Table.ID.Name).
	TargetSchema string
	// Zones maps a DATETIME column to the IANA zone its values are written
	// in; a column not listed is in UTC.
	Zones map[string]string
	// EventTime names the column --since and the daily totals filter and
	// group on ("" = none). It must be a DATETIME or TIMESTAMP column.
	EventTime string
	// Since and Until bound EventTime (Since inclusive, Until exclusive,
	// both UTC); zero means unbounded. Ignored when EventTime is "".
	Since, Until time.Time
}

// Zone returns the source zone of a DATETIME column ("UTC" by default).
func (s *VerifySpec) Zone(column string) string {
	if z := s.Zones[column]; z != "" {
		return z
	}
	return "UTC"
}

// Chunked reports whether the table can be split into key ranges (every
// business-key column is a RangeKey); otherwise it is verified as one chunk.
func (s *VerifySpec) Chunked() bool {
	for _, k := range s.Table.Key {
		if !RangeKey(s.Table.Columns[k].Kind) {
			return false
		}
	}
	return len(s.Table.Key) > 0
}

// GoColumns returns the indexes of the columns compared in Go.
func (s *VerifySpec) GoColumns() []int {
	var out []int
	for i := range s.Table.Columns {
		if GoCompared(s.Table.Columns[i].Kind) {
			out = append(out, i)
		}
	}
	return out
}

// Validate checks the spec's names (every identifier reaches SQL quoted,
// but only after this check).
func (s *VerifySpec) Validate() error {
	if s.Table == nil {
		return errors.New("verify spec: no table")
	}
	id := s.Table.ID
	if err := CheckIdentifier("database", id.Database); err != nil {
		return fmt.Errorf("verify %s: %w", id, err)
	}
	if err := CheckIdentifier("table", id.Name); err != nil {
		return fmt.Errorf("verify %s: %w", id, err)
	}
	if err := CheckIdentifier("target schema", s.TargetSchema); err != nil {
		return fmt.Errorf("verify %s: %w", id, err)
	}
	for _, c := range s.Table.Columns {
		if err := CheckIdentifier("column", c.Name); err != nil {
			return fmt.Errorf("verify %s: %w", id, err)
		}
	}
	if len(s.Table.Key) == 0 {
		return fmt.Errorf("verify %s: no business key (a primary key or a configured business key is required)", id)
	}
	if s.EventTime != "" {
		i := s.Table.ColumnIndex(s.EventTime)
		if i < 0 {
			return fmt.Errorf("verify %s: event-time column %q not in table", id, s.EventTime)
		}
		if k := s.Table.Columns[i].Kind; k != KindDateTime && k != KindTimestamp {
			return fmt.Errorf("verify %s: event-time column %q is %s, want datetime or timestamp", id, s.EventTime, k)
		}
	}
	return nil
}

// KeyRange is a chunk of a table in business-key order: keys greater than
// Lo and at most Hi. Each bound holds the canonical text of every key
// column; nil means unbounded on that side.
type KeyRange struct {
	Lo, Hi []string
}

// String formats the range for messages: "(lo, hi]".
func (r KeyRange) String() string {
	b := func(k []string, inf string) string {
		if k == nil {
			return inf
		}
		return "(" + strings.Join(k, ", ") + ")"
	}
	return "(" + b(r.Lo, "-∞") + ", " + b(r.Hi, "+∞") + "]"
}

// LexPredicate returns the SQL for a row-value comparison of the key
// expressions cols with a bound, expanded so that both databases use an
// index on the leading column:
//
//	greater: c0 >= b0 AND (c0 > b0 OR (c0 = b0 AND (c1 > b1 ...)))   (cols) >  (bound)
//	else:    c0 <= b0 AND (c0 < b0 OR (c0 = b0 AND (c1 <= b1 ...)))  (cols) <= (bound)
//
// bound(i) is called every time the i-th bound value appears, in text
// order, and returns its SQL (a placeholder, after recording the argument).
func LexPredicate(cols []string, bound func(i int) string, greater bool) string {
	var b strings.Builder
	lead, strict, last := "<=", "<", "<="
	if greater {
		lead, strict, last = ">=", ">", ">"
	}
	b.WriteString(cols[0] + " " + lead + " " + bound(0) + " AND ")
	var rec func(i int)
	rec = func(i int) {
		if i == len(cols)-1 {
			b.WriteString(cols[i] + " " + last + " " + bound(i))
			return
		}
		b.WriteString("(" + cols[i] + " " + strict + " " + bound(i) + " OR (" + cols[i] + " = " + bound(i) + " AND ")
		rec(i + 1)
		b.WriteString("))")
	}
	b.WriteString("(")
	rec(0)
	b.WriteString(")")
	return b.String()
}

// ChunkChecksum is what one side computes over a key range: the number of
// rows and the XOR of their 64-bit row hashes.
type ChunkChecksum struct {
	Rows int64
	Sum  uint64
}

// RowDigest is one row of a drill-down: its key, its row hash and the
// canonical text of the columns compared in Go (VerifySpec.GoColumns, in
// order; nil is NULL).
type RowDigest struct {
	Key  []string
	Hash uint64
	Go   []*string
}

// DayTotals is one UTC day of the daily reconciliation: the row count and
// the SUM of each configured column as exact decimal text ("" when NULL).
type DayTotals struct {
	Day   string // YYYY-MM-DD (UTC)
	Count int64
	Sums  []string
}

// DuplicateKey is a business key held by more than one target row.
type DuplicateKey struct {
	Key  []string
	Rows int64
}

// DuplicateReport is the result of a duplicate-key assertion.
type DuplicateReport struct {
	// Groups is the number of keys held more than once.
	Groups int64
	// Examples lists the first of them.
	Examples []DuplicateKey
}

// Err returns nil when there are no duplicates, else an error wrapping
// ErrDuplicateKeys that names the table and the first keys.
func (d DuplicateReport) Err(table string) error {
	if d.Groups == 0 {
		return nil
	}
	var ex []string
	for _, e := range d.Examples {
		ex = append(ex, fmt.Sprintf("(%s)×%d", strings.Join(e.Key, ", "), e.Rows))
	}
	return fmt.Errorf("assert unique keys in %s: %d keys held more than once, e.g. %s: %w", table, d.Groups, strings.Join(ex, " "), ErrDuplicateKeys)
}

// VerifySide is what both sides compute, each in its own database.
type VerifySide interface {
	// Checksum returns the row count and XOR of row hashes of the rows in
	// r (and in the spec's event-time window).
	Checksum(ctx context.Context, spec *VerifySpec, r KeyRange) (ChunkChecksum, error)
	// Digests returns the key, row hash and Go-compared values of every
	// row in r: the drill-down of a chunk that differs.
	Digests(ctx context.Context, spec *VerifySpec, r KeyRange) ([]RowDigest, error)
	// Rows returns the canonical text of every column (nil = NULL) of the
	// rows with the given keys, by key (strings.Join(key, "\x00")); a key
	// not found is absent.
	Rows(ctx context.Context, spec *VerifySpec, keys [][]string) (map[string][]*string, error)
	// DailyTotals returns COUNT(*) and SUM of each column in sums per UTC
	// day of spec.EventTime, in the spec's window, ordered by day.
	DailyTotals(ctx context.Context, spec *VerifySpec, sums []string) ([]DayTotals, error)
}

// SourceVerifier is the source side of a verification.
type SourceVerifier interface {
	VerifySide
	// Tables lists the source tables the pipeline replicates.
	Tables(ctx context.Context) ([]TableID, error)
	// Table reads the current schema of a source table, with the
	// configured business key.
	Table(ctx context.Context, id TableID) (*Table, error)
	// NextBound returns the upper bound of the chunk that starts after
	// lo (nil: at the first key) and holds at most rows rows, in
	// business-key order; ok is false when fewer rows remain (the chunk is
	// the last and unbounded above).
	NextBound(ctx context.Context, spec *VerifySpec, lo []string, rows int) (hi []string, ok bool, err error)
}

// TargetVerifier is the target side of a verification.
type TargetVerifier interface {
	VerifySide
	// DuplicateKeys finds business keys held by more than one target row
	// (soft-deleted rows included). With since non-zero only keys of rows
	// loaded at or after since are checked. At most limit examples are
	// returned.
	DuplicateKeys(ctx context.Context, spec *VerifySpec, since time.Time, limit int) (DuplicateReport, error)
}

// AssertTarget is a target that checks its own business keys: the
// post-load assertion (verify.Asserter) runs on it after every snapshot or
// catch-up window and on a schedule.
type AssertTarget interface {
	// AppliedTables returns the source tables the target has applied
	// changes to since it was opened: the tables a scheduled assertion
	// checks.
	AppliedTables() []*Table
	// AssertNoDuplicateKeys returns an error wrapping ErrDuplicateKeys,
	// naming the target table and the first keys, when the target holds a
	// business key of t more than once — among every row (since zero) or
	// among the keys of the rows loaded at or after since (the target's
	// clock).
	AssertNoDuplicateKeys(ctx context.Context, t *Table, since time.Time) error
	// Now returns the target's clock (UTC).
	Now(ctx context.Context) (time.Time, error)
}

// Retention describes how long the source keeps the binlog file holding a
// checkpoint. A file is purged at a rotation once its last write (≈ the
// creation time of the next file) is older than the expiry setting, so
//
//	PurgeAfter = creation time of the next file + Expire
//	Headroom   = PurgeAfter − now
//
// While the checkpoint's file is the current one (still written to) it
// cannot be purged: Headroom is at least Expire and Open is true.
type Retention struct {
	// Expire is the server's binlog expiry (binlog_expire_logs_seconds or
	// expire_logs_days); 0 means binlogs are never purged by age.
	Expire time.Duration
	// File is the checkpoint's binlog file.
	File string
	// Files is the number of binlog files on the server; Oldest the first.
	Files  int
	Oldest string
	// Open reports that File is the file being written.
	Open bool
	// Purged reports that File is no longer on the server.
	Purged bool
	// ClosedAt is when File was closed (creation of the next file, 1 s
	// resolution); zero while Open.
	ClosedAt time.Time
	// PurgeAfter is the earliest time File can be purged; zero when
	// Unbounded or Open.
	PurgeAfter time.Time
	// Headroom is PurgeAfter − now (negative: purgeable at the next
	// rotation); Expire while Open.
	Headroom time.Duration
	// Unbounded is true when Expire is 0.
	Unbounded bool
}

// TableStatus is what the target knows about one replicated table.
type TableStatus struct {
	// Schema and Name are the target table.
	Schema, Name string
	// Watermark is the table's catch-up watermark, if any.
	Watermark time.Time
	// Rows is PostgreSQL's row estimate (pg_class.reltuples; -1 unknown).
	Rows int64
	// LastCommit is the newest source commit time of a row in the table;
	// LastLoaded when the target stored that row; zero when unknown.
	LastCommit, LastLoaded time.Time
	// Lag is LastLoaded − LastCommit: source commit → target commit of the
	// newest row (source and target clocks; 1 s resolution of binlog
	// timestamps).
	Lag time.Duration
}

// VerifyRun is the outcome of one `tidemark verify` run, kept in the target
// so that the daemon shows the last one (status page, metrics).
type VerifyRun struct {
	Source string
	// Verdict is "equal", "different" or "error".
	Verdict string
	// Tables is the number of tables verified; Differing those that
	// differ; Errors those that could not be verified.
	Tables, Differing, Errors int
	// Summary names the differing tables and what differs (never a
	// value).
	Summary string
	// FinishedAt is the target's clock when the run was recorded.
	FinishedAt time.Time
}

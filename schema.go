package tidemark

import (
	"context"
	"fmt"
	"strings"
	"unicode"
)

// TableID names a source table.
type TableID struct {
	Database string
	Name     string
}

// String returns "database.table".
func (id TableID) String() string { return id.Database + "." + id.Name }

// ParseTableID parses "database.table" (String's form; each part a valid
// identifier, see ValidIdentifier). The error quotes s.
func ParseTableID(s string) (TableID, error) {
	db, name, ok := strings.Cut(s, ".")
	if !ok || !ValidIdentifier(db) || !ValidIdentifier(name) {
		return TableID{}, fmt.Errorf("table %q: want database.table", s)
	}
	return TableID{Database: db, Name: name}, nil
}

// Kind is the normalized type of a column. Each kind has exactly one Go
// representation in Change images (nil is NULL for every kind):
//
//	KindInt       int64           TINYINT..BIGINT signed, MEDIUMINT
//	KindUint      uint64          unsigned integers up to 18446744073709551615
//	KindDecimal   Decimal         exact decimal text, never a float
//	KindFloat     float32         FLOAT
//	KindDouble    float64         DOUBLE
//	KindText      string          CHAR/VARCHAR/TEXT (valid UTF-8)
//	KindBytes     []byte          BINARY/VARBINARY/BLOB
//	KindBit       uint64          BIT(n), Length = n
//	KindYear      int64           YEAR
//	KindDate      time.Time       DATE, midnight UTC
//	KindTime      time.Duration   TIME (may be negative or over 24h)
//	KindDateTime  time.Time       DATETIME, converted from the source zone to UTC
//	KindTimestamp time.Time       TIMESTAMP, the UTC instant
//	KindJSON      JSON            JSON text (MySQL JSON, MariaDB LONGTEXT+json_valid)
//	KindEnum      string          ENUM member name
//	KindSet       string          SET members, comma-separated
type Kind uint8

// The column kinds.
const (
	KindInt Kind = iota + 1
	KindUint
	KindDecimal
	KindFloat
	KindDouble
	KindText
	KindBytes
	KindBit
	KindYear
	KindDate
	KindTime
	KindDateTime
	KindTimestamp
	KindJSON
	KindEnum
	KindSet
)

var kindNames = map[Kind]string{
	KindInt: "int", KindUint: "uint", KindDecimal: "decimal", KindFloat: "float",
	KindDouble: "double", KindText: "text", KindBytes: "bytes", KindBit: "bit",
	KindYear: "year", KindDate: "date", KindTime: "time", KindDateTime: "datetime",
	KindTimestamp: "timestamp", KindJSON: "json", KindEnum: "enum", KindSet: "set",
}

// String returns the kind's name.
func (k Kind) String() string {
	if s, ok := kindNames[k]; ok {
		return s
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Decimal is an exact decimal number in canonical text form ("-12.340").
type Decimal string

// JSON is a JSON document as text.
type JSON string

// Column describes one source column.
type Column struct {
	Name string
	Kind Kind
	// Bits is the integer width in bits for KindInt/KindUint (8, 16, 24, 32,
	// 64) and the width n of BIT(n).
	Bits int
	// Precision and Scale of a DECIMAL; Scale is also the fractional-second
	// precision of DATETIME/TIMESTAMP/TIME when known.
	Precision, Scale int
	// Nullable is false when the source declares NOT NULL (when known).
	Nullable bool
	// JSONUnknown marks a KindText column that may be JSON, which the
	// source could not tell: MariaDB's JSON is a LONGTEXT with a
	// json_valid check that only information_schema shows, and a layout
	// older than the table's current one can name a LONGTEXT column
	// information_schema no longer lists (renamed or dropped since, or the
	// table dropped and created anew) and that the tailer never saw listed
	// (binlog.Tailer.jsonColumns). Its values are strings. A sink that
	// knows the column resolves it (the PostgreSQL sink: JSON when its
	// target table has it as JSON, else text); one that does not takes it
	// as text. Not part of the Fingerprint: the layout is the same, only
	// what the source could tell about it differs.
	JSONUnknown bool
}

// Table is the schema of a source table as rows were written with it.
type Table struct {
	ID      TableID
	Columns []Column
	// Key holds the indexes into Columns of the business key, in order: the
	// primary key by default, a configured composite key otherwise.
	Key []int
	// Indexes are the table's secondary indexes when IndexesKnown. The
	// binlog source reads them with each new table layout; a snapshot's
	// schema leaves them unknown so that a sink builds them after the load
	// (IndexMirror). They are not part of the Fingerprint: index changes
	// arrive as DDL events (DDLEvent.Indexes).
	Indexes      []Index
	IndexesKnown bool
	// Since, when not zero, is the version of the first change published
	// with this layout (the scale-out tailer's schema control records
	// carry it). The partitions of a table reach a new layout at
	// different times, so a sink that is one of several writers of the
	// table (an applier) never evolves a target table to a layout older
	// than the one it was evolved to: the older layout's rows are written
	// into the newer table. A snapshot source's layout (binlog.Reader) is
	// stamped with the version just above the binlog's end when it was
	// read, at or above its first change: the stream's rows from a
	// snapshot's capture up to there are of that layout or older ones.
	// Not part of the Fingerprint.
	Since Version
	// AfterDrop, when not zero, is the version of a DROP TABLE of the
	// table that the table of this layout was created after (the
	// scale-out tailer's schema records carry it). A partition that lags
	// behind another's drop record still writes rows of the dropped
	// table, and may create its target again; a target aligned to a
	// layout older than AfterDrop is that one, every row of it older than
	// the drop, which its partitions' drop records remove: a sink
	// replaces it rather than refusing the new table's other business
	// key. Not part of the Fingerprint.
	AfterDrop Version
}

// HasJSONUnknown reports whether a column of t is JSONUnknown.
func (t *Table) HasJSONUnknown() bool {
	for i := range t.Columns {
		if t.Columns[i].JSONUnknown {
			return true
		}
	}
	return false
}

// ColumnIndex returns the index of the named column, or -1.
func (t *Table) ColumnIndex(name string) int {
	for i := range t.Columns {
		if t.Columns[i].Name == name {
			return i
		}
	}
	return -1
}

// KeyNames returns the business-key column names.
func (t *Table) KeyNames() []string {
	out := make([]string, len(t.Key))
	for i, k := range t.Key {
		out[i] = t.Columns[k].Name
	}
	return out
}

// Fingerprint returns a string that changes whenever the column list, kinds
// or key change; sinks use it to notice a schema change.
func (t *Table) Fingerprint() string {
	var b strings.Builder
	for _, c := range t.Columns {
		fmt.Fprintf(&b, "%s:%s:%d:%d:%d:%t;", c.Name, c.Kind, c.Bits, c.Precision, c.Scale, c.Nullable)
	}
	fmt.Fprintf(&b, "key=%v", t.Key)
	return b.String()
}

// ValidIdentifier reports whether s is acceptable as a database, table or
// column name in tidemark: 1 to 63 characters (PostgreSQL's limit), letters,
// digits, '_', '$', space or '-', not starting with a space or '-'. Names are
// always quoted when they reach SQL; this rejects the rest (quotes, NUL,
// control characters) with a clear error instead of trusting the quoting.
//
// It is a loop over the runes rather than a regular expression: compiling the
// Unicode classes cost every tidemark process 2.4 MB and 3-5 ms at package
// init. An invalid UTF-8 byte decodes as utf8.RuneError, which is neither a
// letter nor a digit, so it is rejected.
func ValidIdentifier(s string) bool {
	n := 0
	for i, r := range s {
		if n++; n > 63 {
			return false
		}
		switch {
		case r == '_' || r == '$' || unicode.IsLetter(r) || unicode.IsNumber(r):
		case (r == ' ' || r == '-') && i > 0:
		default:
			return false
		}
	}
	return n > 0 && s[len(s)-1] != ' '
}

// CheckIdentifier returns an error naming what the identifier is for when
// ValidIdentifier rejects it.
func CheckIdentifier(what, s string) error {
	if !ValidIdentifier(s) {
		return fmt.Errorf("%w: %s %q", ErrInvalidIdentifier, what, s)
	}
	return nil
}

// QuoteMySQL quotes an identifier for MySQL and MariaDB: in backticks, with
// embedded backticks doubled. It is the one quoting helper of that dialect;
// names are validated with CheckIdentifier first, quoting is the second line
// of defence.
func QuoteMySQL(name string) string {
	return "`" + strings.ReplaceAll(name, "`", "``") + "`"
}

// QuotePostgres quotes an identifier for PostgreSQL: in double quotes, with
// embedded double quotes doubled. It is the one quoting helper of that
// dialect; names are validated with CheckIdentifier first, quoting is the
// second line of defence.
func QuotePostgres(name string) string {
	return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
}

// Index is a secondary index of a source table (the primary key is
// Table.Key). Targets that mirror indexes (see IndexMirror) build theirs
// from it.
type Index struct {
	// Name is the source's index name.
	Name string
	// Unique is set for a UNIQUE index.
	Unique bool
	// Type is the source's index type in upper case: BTREE, HASH,
	// FULLTEXT, SPATIAL, ...
	Type string
	// Columns are the indexed columns in index order.
	Columns []IndexColumn
}

// IndexColumn is one part of an Index.
type IndexColumn struct {
	Name string
	// Prefix is the number of leading characters (bytes for binary
	// columns) indexed; 0 indexes the whole value.
	Prefix int
	// Desc is set for a descending part.
	Desc bool
}

// IndexLister is implemented by sources that can list a table's secondary
// indexes as the source's catalog holds them now.
type IndexLister interface {
	// Indexes returns the secondary indexes of a table, in name order
	// (none for a table that does not exist).
	Indexes(ctx context.Context, id TableID) ([]Index, error)
}

// IndexMirror is implemented by sinks that mirror the source's secondary
// indexes onto their target tables.
type IndexMirror interface {
	// MirrorIndexes brings the target table's mirrored indexes to idx:
	// creates the missing ones, drops those the source no longer has, and
	// leaves indexes it did not create alone. An index the target cannot
	// mirror is skipped with one log line naming it. A missing target
	// table is not an error (nothing to index yet).
	MirrorIndexes(ctx context.Context, id TableID, idx []Index) error
}

// IndexMirrorAfter is implemented by index mirrors that can hold the unique
// constraints a load dropped until the stream is past the load. A load
// that reads chunk by chunk, resumed after a kill or not, leaves a target
// mixed from several read times: a row read early whose source row was
// deleted or changed since keeps its old values until the stream applies
// that change, so a unique check right after the load judges a state the
// source never had. The target is consistent once the stream has applied
// past a position captured after the load's last read (the high
// watermark).
type IndexMirrorAfter interface {
	// MirrorIndexesAfter is MirrorIndexes, except that the unique
	// constraints a load dropped are built (and a violation judged: the
	// table quarantined, ErrHeldConstraint) by the first batch of source
	// whose checkpoint is at or past after; until then they wait, across
	// restarts. A zero after builds them now.
	MirrorIndexesAfter(ctx context.Context, source string, id TableID, idx []Index, after Position) error
}

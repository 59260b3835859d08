package tidemark

import (
	"errors"
	"fmt"
)

// Sentinel errors. Wrap them with context ("verb noun: %w") and test with
// errors.Is.
var (
	// ErrPositionPurged means the source no longer has the binlog position a
	// reader asked for (purged files or GTID state too old). It is never
	// retried; the fallback catch-up handles it.
	ErrPositionPurged = errors.New("binlog position purged on source")
	// ErrPositionAhead means the requested position is ahead of anything the
	// source has written (a GTID from another server or a reset source). It
	// is fatal: falling back blindly could skip or double data.
	ErrPositionAhead = errors.New("binlog position ahead of source")
	// ErrSourceChanged means the server a checkpoint was read from is not
	// the server the source's address reaches now (another server, flavor
	// or binlog) and tidemark cannot follow the change safely. It is fatal;
	// the message names what changed and what to do.
	ErrSourceChanged = errors.New("source identity changed")
	// ErrIncomparable means two positions cannot be ordered.
	ErrIncomparable = errors.New("positions are not comparable")
	// ErrInvalidIdentifier means a database, table or column name cannot be
	// used safely as an SQL identifier.
	ErrInvalidIdentifier = errors.New("invalid identifier")
	// ErrSourceConfig means the source server is not configured for CDC
	// (binlog format, row image, row metadata...). The message names the
	// setting to change.
	ErrSourceConfig = errors.New("source server not configured for CDC")
	// ErrZeroDate means a zero date ('0000-00-00') was read and the
	// configuration says to reject it.
	ErrZeroDate = errors.New("zero date")
	// ErrNonexistentTime means a local time falls in a DST gap and the
	// policy is "error".
	ErrNonexistentTime = errors.New("nonexistent local time (DST gap)")
	// ErrAmbiguousTime means a local time falls in a DST fold and the policy
	// is "error".
	ErrAmbiguousTime = errors.New("ambiguous local time (DST fold)")
	// ErrStatsMismatch means a sink's counts do not add up to the changes it
	// was given: a bug, never just a metric.
	ErrStatsMismatch = errors.New("apply counts do not add up")

	// ErrEpochRegressed is a checkpoint whose version epoch is below the
	// highest epoch the source's rows were written in (the epoch floor):
	// its changes would lose to the rows already in the target.
	ErrEpochRegressed = errors.New("version epoch below the source's epoch floor")

	// ErrTableGone means a table a catch-up or snapshot listed (or was
	// asked to read) no longer exists on the source: renamed or dropped
	// since (a gh-ost / pt-osc cut-over renames tables constantly). The
	// binlog carries the RENAME or DROP, after the position the read
	// captured, so the stream follows it; the read leaves the table out.
	ErrTableGone = errors.New("table no longer exists on the source")
	// ErrServerIDInUse means the source server ended a binlog stream
	// because another client registered with the same replica server_id:
	// MariaDB and MySQL keep one binlog dump per id and end the older one
	// (a process that was killed leaves nothing in the way: the newer one
	// always wins). Reconnecting would end the other client's stream in
	// turn, so a source takes its id back only while its pipeline proves
	// that it is still the source's only writer (WriterCheckable).
	ErrServerIDInUse = errors.New("another replica connected with this replica server_id")
	// ErrFenced means a sink refused a write because another instance
	// took over writing for the source (Kafka fenced the transactional
	// producer: the newer instance wins). It is never retried and is no
	// table's fault: the process stops; a snapshot that fails on it does
	// not quarantine its table.
	ErrFenced = errors.New("fenced by another instance")
)

// ValueError reports a value that cannot be normalized, naming where it came
// from. It never holds the value itself when the column may carry secrets;
// Detail is a short description.
type ValueError struct {
	Table  TableID
	Column string
	Detail string
	Err    error
}

// Error implements error.
func (e *ValueError) Error() string {
	msg := fmt.Sprintf("convert value of %s.%s: %s", e.Table, e.Column, e.Detail)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap returns the underlying error.
func (e *ValueError) Unwrap() error { return e.Err }

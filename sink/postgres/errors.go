package postgres

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"tidemark"
)

// retryable is the sink's classifier for tidemark.Retry: connection loss,
// serialization failures, deadlocks, server shutdown and too many
// connections are transient; everything else (data errors, constraint
// violations, bad SQL, authentication) is not.
func retryable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, context.Canceled) {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) {
		// An attempt's apply_timeout (the caller's own context being done
		// stops tidemark.Retry before it asks).
		return true
	}
	if tidemark.IsTLSVerifyError(err) {
		return false // the server's certificate did not verify: a retry would not change it
	}
	var amb *ambiguousCommitError
	if errors.As(err, &amb) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "08"): // connection exception
			return true
		case pgErr.Code == "40001", // serialization_failure
			pgErr.Code == "40P01", // deadlock_detected
			pgErr.Code == "57P01", // admin_shutdown
			pgErr.Code == "57P02", // crash_shutdown
			pgErr.Code == "57P03", // cannot_connect_now
			pgErr.Code == "53300": // too_many_connections
			return true
		}
		return false
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		return true
	}
	var connErr *pgconn.ConnectError
	if errors.As(err, &connErr) {
		return true
	}
	return pgconn.SafeToRetry(err) || pgconn.Timeout(err)
}

// ambiguousCommitError is a COMMIT that failed without an answer from the
// server. resolveErr is nil when the sink verified that the transaction did
// not commit; otherwise the outcome is unknown. Either way the batch is
// retried whole, which the version guard makes safe.
type ambiguousCommitError struct {
	err        error
	resolveErr error
}

func (e *ambiguousCommitError) Error() string {
	if e.resolveErr == nil {
		return "commit failed and did not take effect (verified): " + e.err.Error()
	}
	return "commit outcome unknown (checking it failed: " + e.resolveErr.Error() +
		"); replaying the batch from the stored checkpoint is safe: " + e.err.Error()
}
func (e *ambiguousCommitError) Unwrap() error { return e.err }

// commitMayHaveHappened reports whether a failed COMMIT may nevertheless
// have committed: the server did not answer (connection lost, timeout,
// context cancelled mid-flight). An error answer (SQLSTATE) means it did not
// commit, except that a session-ending one (FATAL, PANIC) is checked as well:
// asking costs nothing on this rare path. An error pgconn marks safe to
// retry means nothing was sent.
func commitMayHaveHappened(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		sev := pgErr.SeverityUnlocalized
		if sev == "" {
			sev = pgErr.Severity
		}
		return sev == "FATAL" || sev == "PANIC"
	}
	if errors.Is(err, pgx.ErrTxCommitRollback) {
		return false
	}
	// No answer from the server. pgconn's SafeToRetry cannot be trusted
	// here: pgx v5.12 reports an EOF while reading COMMIT's answer as a
	// "conn closed" error that claims nothing was sent. Asking the server
	// costs nothing on this rare path.
	return true
}

// errColumn returns the column a PostgreSQL error is about, when it names
// one of t's columns: the error's column field (constraint violations) or a
// COPY context ("COPY stage, line 3, column price").
func errColumn(err error, t *tidemark.Table) string {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return ""
	}
	if pgErr.ColumnName != "" {
		return pgErr.ColumnName
	}
	if pgErr.Where == "" || t == nil {
		return ""
	}
	// Text COPY: "COPY x, line 1, column c: "value""; binary COPY: "COPY x,
	// line 1, column c". Only the name is taken, never the value.
	for i := range t.Columns {
		marker := ", column " + t.Columns[i].Name
		for w := pgErr.Where; ; {
			j := strings.Index(w, marker)
			if j < 0 {
				break
			}
			rest := w[j+len(marker):]
			if rest == "" || rest[0] == ':' || rest[0] == '\n' {
				return t.Columns[i].Name
			}
			w = rest
		}
	}
	return ""
}

// redactedError carries a message with secrets replaced. It unwraps to the
// cause (minus pgconn.ConnectError, whose Config holds the password) so that
// errors.Is/As keep working for classification.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// redact removes the password from err's text and drops any
// pgconn.ConnectError (which exposes the whole connection config) from its
// chain. secret may be empty.
func redact(err error, secret string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if secret != "" {
		msg = strings.ReplaceAll(msg, secret, "[redacted]")
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return &redactedError{msg: msg, err: ce.Unwrap()}
	}
	if msg != err.Error() {
		return &redactedError{msg: msg, err: err}
	}
	return err
}

// parseErrorText describes a DSN parse error without the DSN. pgx's
// ParseConfigError ("cannot parse `<dsn>`: <reason> (<cause>)") only
// best-effort redacts the string, and the cause can quote parts of it, so
// only pgx's fixed reason is kept.
func parseErrorText(err error) string {
	msg := err.Error()
	j := strings.LastIndexByte(msg, '`')
	if j < 0 {
		return "cannot parse the connection string"
	}
	reason := strings.TrimPrefix(msg[j+1:], ": ")
	if k := strings.Index(reason, " ("); k >= 0 {
		reason = reason[:k]
	}
	if reason == "" || strings.ContainsAny(reason, "@=/`") {
		return "cannot parse the connection string"
	}
	return "cannot parse the connection string: " + reason
}

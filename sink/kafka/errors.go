package kafka

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"tidemark"
)

// ErrFenced means Kafka fenced this sink's transactional producer because
// another instance started with the same transactional id (the newer
// instance wins; this one can no longer commit). It is never retried: the
// instance must stop. Test with errors.Is. It is tidemark.ErrFenced, so
// that the pipeline tells it from a table's failure.
var ErrFenced = tidemark.ErrFenced

// fencedError names the transactional id and the broker's answer.
type fencedError struct {
	txnID string
	err   error
}

func (e *fencedError) Error() string {
	return fmt.Sprintf("sink/kafka: fenced by another instance with transactional id %s "+
		"(the id was taken over, as a tidemark run, catchup or resync of the same source does when it starts; this process can no longer commit): %v", e.txnID, e.err)
}

func (e *fencedError) Unwrap() []error { return []error{ErrFenced, e.err} }

// isFenced reports whether err is the broker fencing this producer: another
// producer initialized the same transactional id with a newer epoch
// (PRODUCER_FENCED). INVALID_PRODUCER_EPOCH on a produce is not one by
// itself: the transaction coordinator answers it too after it aborted the
// transaction on its own (transaction_timeout passed, as across a broker
// restart) and bumped the epoch. Aborting tells the two apart (abort): the
// coordinator answers the abort with PRODUCER_FENCED only when another
// producer took the id over, and accepts it after its own abort (measured
// on Apache Kafka 4.4, TestKafkaTransactionAbortedByCoordinatorRecovers).
func isFenced(err error) bool {
	return errors.Is(err, ErrFenced) || errors.Is(err, kerr.ProducerFenced)
}

// unresolvedCommitError is a commit whose outcome could not be learned
// within Config.CommitResolveTimeout (finishing the transaction at the
// coordinator, or reading the checkpoint back, kept failing). It is not
// retried: republishing could duplicate the batch. The restarted pipeline
// reads the checkpoint first.
type unresolvedCommitError struct {
	commitErr, resolveErr error
}

func (e *unresolvedCommitError) Error() string {
	return fmt.Sprintf("commit outcome unknown (learning it failed: %v); restart to resume from the stored checkpoint: %v", e.resolveErr, e.commitErr)
}

func (e *unresolvedCommitError) Unwrap() error { return e.commitErr }

// retryable is the sink's classifier for tidemark.Retry. franz-go already
// retries what it classifies as retryable for single requests and records
// (without limit, by default); what reaches the sink and is worth
// republishing the batch for is an abortable transaction, a producer id to
// reload, a coordinator or connection that outlived the client's own
// retries, or a verified uncommitted transaction.
func retryable(err error) bool {
	switch {
	case err == nil, isFenced(err), errors.Is(err, context.Canceled):
		return false
	}
	if errors.Is(err, ErrKafkaAuth) || tidemark.IsTLSVerifyError(err) || errors.Is(err, kerr.SaslAuthenticationFailed) {
		return false // a refused login or certificate: a retry would not change it
	}
	var unresolved *unresolvedCommitError
	if errors.As(err, &unresolved) {
		return false
	}
	if tidemark.IsRetryable(err) {
		return true // e.g. verified not committed, on a new client
	}
	var ke *kerr.Error
	if errors.As(err, &ke) {
		switch ke {
		case kerr.TransactionAbortable, kerr.OperationNotAttempted, kerr.UnknownProducerID,
			kerr.InvalidProducerIDMapping, kerr.ConcurrentTransactions,
			kerr.InvalidProducerEpoch: // the transaction was aborted (abort), not fenced
			return true
		case kerr.OutOfOrderSequenceNumber:
			// A produce that failed while the next one to its
			// partition was in flight leaves that one out of sequence;
			// franz-go hands it back. The transaction (or batch) is
			// aborted and published again, with a reset sequence.
			return true
		}
		return ke.Retriable
	}
	switch {
	case errors.Is(err, kgo.ErrRecordTimeout), errors.Is(err, kgo.ErrRecordRetries),
		errors.Is(err, kgo.ErrAborting), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), kgo.IsRetryableBrokerErr(err):
		return true
	}
	var netErr net.Error
	return errors.As(err, &netErr)
}

// kgoLogger routes franz-go's log lines into slog: its errors and warnings
// at their level, its (chatty, once per transaction) info lines at debug.
type kgoLogger struct {
	l     *slog.Logger
	debug bool // l is enabled at debug level
}

func (k kgoLogger) Level() kgo.LogLevel {
	if k.debug {
		return kgo.LogLevelInfo
	}
	return kgo.LogLevelWarn
}

func (k kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	switch level {
	case kgo.LogLevelError:
		k.l.Error(msg, keyvals...)
	case kgo.LogLevelWarn:
		k.l.Warn(msg, keyvals...)
	default:
		k.l.Debug(msg, keyvals...)
	}
}

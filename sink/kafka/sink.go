// Package kafka is tidemark's Kafka sink: it publishes every change as a
// JSON envelope to a topic per table, and records the batch's checkpoint in
// a compacted checkpoint topic, through franz-go.
//
// Records: key = the business key as a JSON object (key columns in key
// order), value = the change envelope (see envelope.go and
// docs/kafka-envelope.schema.json), headers op (c/u/d/r), schema_version
// (EnvelopeVersion) and table_schema (a hash of the table's columns, kinds
// and key). Records of one key go to one partition, in source order. With
// Config.Tombstones a delete is followed by a record with the same key and
// a null value (no headers).
//
// Delivery. The producer is always idempotent (no duplicates from the
// client's own retries, no reordering within a partition). With
// Config.ExactlyOnce each batch is one Kafka transaction holding its change
// records and its checkpoint record, so a read_committed consumer sees a
// batch whole or not at all and the stored checkpoint never disagrees with
// the published data; on start the checkpoint is read back from the topic.
// Without it (at least once) the checkpoint record is written after the
// batch's records are acknowledged, and a crash in between republishes the
// batch on restart.
//
// Every change is published (no coalescing: consumers get the history), so
// ApplyStats counts each change as Inserted (c and r), Updated or Deleted,
// Coalesced is 0, and Skipped counts the changes of a batch the sink drops
// whole because its checkpoint is not newer than the stored one (a replay
// in a fan-out with another sink; see Apply).
//
// The per-table catch-up watermarks of the batches are stored in the
// checkpoint records (all of a source's watermarks in each), committed with
// the data, and read back by Watermark. docs/kafka.md has the details and
// the consumer's view.
package kafka

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	mathrand "math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"tidemark"
)

// Sink publishes batches to Kafka. Its methods are safe for concurrent use
// and serialized: one batch is published at a time, in the order Apply is
// called.
type Sink struct {
	cfg      Config
	cl       *kgo.Client
	adm      *kadm.Client
	kopts    []kgo.Opt // cl's options: renewClient makes a new cl with them
	log      *slog.Logger
	klog     kgoLogger
	rlog     *tidemark.RateLimitedLogger
	instance string // random, prefixes the batch ids of checkpoint records

	mu             sync.Mutex
	attempts       uint64
	bytesPerChange int // of the last batch encoded: sizes the next one's buffer
	codecs         map[codecKey]*codec
	shown          map[tableKey]*codec // the codec whose schema was published last per table (ControlRecords)
	// dropped is the version of the last DROP TABLE published per table
	// (PublishDDL), which the table's schema records carry after it.
	dropped      map[tableKey]tidemark.Version
	topics       map[topicKey]string
	topicOwner   map[string]topicKey
	partitions   map[string]int32       // partition count of the change topics (ControlRecords)
	watch        *partitionWatch        // the counts the partitioner must find (ControlRecords)
	countsAt     time.Time              // when the live counts were last compared
	stored       map[string]sourceState // per source: what is known to be committed
	lastPID      int64                  // producer id of the last commit (hasLastPID): readCheckpoint waits for its marker
	hasLastPID   bool
	openWaitTest time.Duration // tests: readCheckpoint's wait for an open transaction
	txnOpen      bool          // a transaction was begun and not ended
	active       bool          // the transactional id is initialized (Activate)
	fenced       error         // sticky: ErrFenced

	// Test hooks (nil in production). hookBeforeCommit runs just before
	// the commit (EndTxn, or the checkpoint record without ExactlyOnce)
	// and hookAfterCommit just after it succeeded; an error they return
	// stops Apply there, as a crash would (a transaction is left open).
	// hookCommitResult replaces EndTxn's result, to lose its answer.
	hookBeforeCommit func() error
	hookAfterCommit  func() error
	hookCommitResult func(error) error
	now              func() time.Time
}

var (
	_ tidemark.Sink           = (*Sink)(nil)
	_ tidemark.WatermarkStore = (*Sink)(nil)
	_ tidemark.Activator      = (*Sink)(nil)
)

// Open validates cfg, connects and creates the checkpoint topic if it is
// missing. It does not touch the transactional id: with ExactlyOnce the
// producer is initialized by Activate or the first Apply, so that an
// instance that only reads (Checkpoint, Watermark) never fences the one
// that writes. Transient errors are retried with cfg.Retry until ctx is
// done.
func Open(ctx context.Context, cfg Config) (*Sink, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger.With("component", "sink/kafka")
	klog := kgoLogger{l: log.With("lib", "franz-go"), debug: log.Enabled(ctx, slog.LevelDebug)}
	watch := &partitionWatch{want: map[string]int32{}}
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ClientID(cfg.ClientID),
		kgo.WithLogger(klog),
		kgo.RecordPartitioner(newPartitioner(cfg.CheckpointTopic, watch)),
		kgo.MaxBufferedRecords(cfg.MaxBufferedRecords),
		kgo.MaxBufferedBytes(cfg.MaxBufferedBytes),
		kgo.ProducerBatchMaxBytes(cfg.MaxRecordBytes),
		// A produce answered with a retriable error (the first records
		// to a topic just created) waits for a metadata refresh, and
		// franz-go spaces refreshes by this: its 5 s default stalled
		// the first transaction of every new table for 5 s (issue 25).
		// Refreshes are only triggered by errors and new topics, so a
		// short spacing costs a few requests, not a steady load.
		kgo.MetadataMinAge(metadataMinAge),
		kgo.RetryBackoffFn(retryBackoff),
	}
	sec, err := cfg.Security.opts()
	if err != nil {
		return nil, err
	}
	// Every client of the sink (the checkpoint reader too) connects so.
	cfg.kgoOpts = append(sec, cfg.kgoOpts...)
	opts = append(opts, cfg.kgoOpts...)
	if cfg.ExactlyOnce {
		opts = append(opts, kgo.TransactionalID(cfg.TransactionalID), kgo.TransactionTimeout(cfg.TransactionTimeout))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("open kafka sink: %w", err)
	}
	var id [8]byte
	rand.Read(id[:])
	s := &Sink{
		cfg:        cfg,
		cl:         cl,
		kopts:      opts,
		adm:        kadm.NewClient(cl),
		log:        log,
		klog:       klog,
		rlog:       &tidemark.RateLimitedLogger{Logger: log},
		instance:   hex.EncodeToString(id[:]),
		codecs:     map[codecKey]*codec{},
		shown:      map[tableKey]*codec{},
		dropped:    map[tableKey]tidemark.Version{},
		topics:     map[topicKey]string{},
		topicOwner: map[string]topicKey{},
		partitions: map[string]int32{},
		watch:      watch,
		stored:     map[string]sourceState{},
		now:        time.Now,
	}
	if err := checkAuth(ctx, cl, cfg.Security, cfg.Brokers); err != nil {
		cl.Close()
		return nil, fmt.Errorf("open kafka sink: %w", err)
	}
	if err := s.init(ctx); err != nil {
		cl.Close()
		return nil, err
	}
	return s, nil
}

func (s *Sink) init(ctx context.Context) error {
	topic := s.cfg.CheckpointTopic
	if _, err := s.createTopic(ctx, topic, 1, map[string]string{"cleanup.policy": "compact"}); err != nil {
		return fmt.Errorf("open kafka sink: %w", err)
	}
	if cfgs, err := s.adm.DescribeTopicConfigs(ctx, topic); err == nil {
		if rc, err := cfgs.On(topic, nil); err == nil {
			for _, c := range rc.Configs {
				if c.Key == "cleanup.policy" && c.MaybeValue() != "compact" && c.MaybeValue() != "compact,delete" {
					s.log.Warn("checkpoint topic is not compacted: the newest checkpoint may expire, or reading it back may slow down as the topic grows; set cleanup.policy=compact",
						"topic", topic, "cleanup.policy", c.MaybeValue())
				}
			}
		}
	}
	return nil
}

// Activate takes over the transactional id (with ExactlyOnce; without it
// there is nothing to take over): it initializes the producer, which fences
// any older instance with the same id and makes the broker finish the
// transaction that instance left open, then forgets what it knew of the
// checkpoints so that they are read back after that. Idempotent; Apply
// activates first when nobody did. Call it only in the instance that is to
// write: the older instance's next produce or commit fails with ErrFenced.
func (s *Sink) Activate(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.activate(ctx)
}

// activate is Activate; callers hold s.mu.
func (s *Sink) activate(ctx context.Context) error {
	if s.fenced != nil {
		return s.fenced
	}
	if s.active || !s.cfg.ExactlyOnce {
		return nil
	}
	err := tidemark.Retry(ctx, "initialize transactional producer", s.cfg.Retry, retryable, s.rlog, func(ctx context.Context) error {
		_, _, err := s.cl.ProducerID(ctx)
		return err
	})
	if err != nil {
		return fmt.Errorf("activate kafka sink: %w", err)
	}
	s.active = true
	// A checkpoint read before the initialization may predate the
	// transaction the older instance was committing.
	clear(s.stored)
	return nil
}

// Close releases the sink's connections. It does not end a transaction that
// an interrupted Apply left open: the broker aborts it after the
// transaction timeout, or the next instance aborts it when it starts.
func (s *Sink) Close() error {
	s.cl.Close()
	return nil
}

// Checkpoint returns the position last committed for source, read back from
// the checkpoint topic (committed records only), and whether there is one.
func (s *Sink) Checkpoint(ctx context.Context, source string) (tidemark.Position, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.stored, source)
	st, err := s.state(ctx, source)
	if err != nil {
		return tidemark.Position{}, false, err
	}
	return st.pos, !st.pos.IsZero(), nil
}

// Watermark returns the catch-up watermark last committed for a table of
// source, and whether there is one (tidemark.WatermarkStore).
func (s *Sink) Watermark(ctx context.Context, source string, table tidemark.TableID) (time.Time, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, err := s.state(ctx, source)
	if err != nil {
		return time.Time{}, false, err
	}
	w, ok := st.marks[table]
	return w, ok, nil
}

// state returns what is committed for source, reading the checkpoint topic
// unless it is known. Callers hold s.mu.
func (s *Sink) state(ctx context.Context, source string) (sourceState, error) {
	if st, ok := s.stored[source]; ok {
		return st, nil
	}
	var st sourceState
	err := tidemark.Retry(ctx, "read checkpoint of "+source, s.cfg.Retry, retryable, s.rlog, func(ctx context.Context) error {
		var err error
		_, st, _, err = s.readCheckpoint(ctx, source)
		return err
	})
	if err != nil {
		return sourceState{}, err
	}
	s.stored[source] = st
	return st, nil
}

// Apply publishes the batch's changes and its checkpoint record, and
// returns when they are acknowledged (committed, with ExactlyOnce). It
// blocks while the producer's buffers are full.
//
// With ExactlyOnce, the records and the checkpoint commit in one
// transaction, so when Apply returns nil all of them are committed, and when
// it returns an error none is — or the sink has read the checkpoint back
// after a commit whose answer was lost and found it committed (then it
// returns nil). A transaction that fails with an error that aborting can fix
// is aborted and republished whole (cfg.Retry); records are never skipped.
// Without ExactlyOnce, a failed batch is republished whole, and records
// acknowledged before the failure are then published twice.
//
// A batch whose checkpoint is not newer than the sink's stored checkpoint is
// dropped whole and counted as Skipped: every change before that checkpoint
// is already published. Only a replay brings such a batch: in a
// tidemark.Fanout, after a crash between two sinks' commits, the pipeline
// resumes from the older sink's checkpoint and the other sink sees batches
// it has. A batch without a checkpoint (part of a transaction larger than a
// batch) cannot be placed and is always published.
//
// An error that wraps ErrFenced means another instance took over the
// transactional id; every later call fails with it.
func (s *Sink) Apply(ctx context.Context, b *tidemark.Batch) (tidemark.ApplyStats, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fenced != nil {
		return tidemark.ApplyStats{}, s.fenced
	}
	if b.Source == "" {
		return tidemark.ApplyStats{}, errors.New("apply batch: source: required")
	}
	if len(b.Changes) == 0 && b.Checkpoint.IsZero() && len(b.Watermarks) == 0 {
		return tidemark.ApplyStats{}, nil
	}
	if err := s.activate(ctx); err != nil {
		return tidemark.ApplyStats{}, err
	}
	stored, err := s.state(ctx, b.Source)
	if err != nil {
		return tidemark.ApplyStats{}, err
	}
	if !b.Checkpoint.IsZero() && !stored.pos.IsZero() {
		// Compared by epoch, then GTID (never by file number across a
		// failover); positions that cannot be ordered stop the apply
		// rather than guess which way to err.
		c, err := b.Checkpoint.Compare(stored.pos)
		if err != nil {
			return tidemark.ApplyStats{}, fmt.Errorf("apply batch of %s: compare its checkpoint with the one stored in Kafka: %w", b.Source, err)
		}
		if c <= 0 {
			if len(b.Changes) > 0 {
				s.log.Info("skipping batch already published", "source", b.Source, "checkpoint", b.Checkpoint.String(), "stored", stored.pos.String(), "changes", len(b.Changes))
			}
			return tidemark.ApplyStats{Skipped: len(b.Changes)}, nil
		}
	}
	enc, stats, err := s.encode(ctx, b)
	if err != nil {
		return tidemark.ApplyStats{}, err
	}
	if err := s.checkPartitionCounts(ctx); err != nil {
		return tidemark.ApplyStats{}, err
	}
	if s.cfg.ExactlyOnce {
		err = s.publishTxn(ctx, b, enc, stored)
	} else {
		err = s.publish(ctx, b, enc, stored)
	}
	if err != nil {
		if s.fenced != nil {
			return tidemark.ApplyStats{}, s.fenced
		}
		if te := s.tooLarge(err); te != nil {
			return tidemark.ApplyStats{}, te
		}
		return tidemark.ApplyStats{}, err
	}
	for k, c := range enc.shown {
		s.shown[k] = c
	}
	return stats, nil
}

// publish is at-least-once delivery: the batch's records, then, once all are
// acknowledged, the checkpoint record (when the checkpoint or a watermark
// moved).
func (s *Sink) publish(ctx context.Context, b *tidemark.Batch, enc *encodedBatch, stored sourceState) error {
	if len(enc.recs) > 0 {
		err := tidemark.Retry(ctx, "publish batch", s.cfg.Retry, retryable, s.rlog, func(ctx context.Context) error {
			return s.produceAll(ctx, enc.records(0))
		})
		if err != nil {
			return err
		}
	}
	if err := s.watch.failed(); err != nil {
		return err // no checkpoint: the batch is published again after a restart
	}
	if b.Checkpoint.IsZero() && len(b.Watermarks) == 0 {
		return nil
	}
	next := s.nextState(b, stored)
	if s.hookBeforeCommit != nil {
		if err := s.hookBeforeCommit(); err != nil {
			return err
		}
	}
	err := tidemark.Retry(ctx, "publish checkpoint", s.cfg.Retry, retryable, s.rlog, func(ctx context.Context) error {
		rec, err := s.checkpointRecord(b.Source, newCheckpoint(next, s.nextBatchID()))
		if err != nil {
			return err
		}
		return s.produceAll(ctx, []kgo.Record{rec})
	})
	if err != nil {
		return err
	}
	s.stored[b.Source] = next
	if s.hookAfterCommit != nil {
		return s.hookAfterCommit()
	}
	return nil
}

// publishTxn is exactly-once delivery: the records and the checkpoint record
// in one transaction, retried whole.
func (s *Sink) publishTxn(ctx context.Context, b *tidemark.Batch, enc *encodedBatch, stored sourceState) error {
	next := s.nextState(b, stored)
	err := tidemark.Retry(ctx, "publish batch in a transaction", s.cfg.Retry, retryable, s.rlog, func(ctx context.Context) error {
		err := s.attemptTxn(ctx, b.Source, enc, newCheckpoint(next, s.nextBatchID()))
		if isFenced(err) && s.fenced == nil {
			fe, ok := errors.AsType[*fencedError](err)
			if !ok {
				fe = &fencedError{txnID: s.cfg.TransactionalID, err: err}
			}
			s.fenced = fe
		}
		return err
	})
	if err != nil {
		var unresolved *unresolvedCommitError
		if errors.As(err, &unresolved) {
			delete(s.stored, b.Source) // unknown: read again before the next batch
		}
		return err
	}
	s.stored[b.Source] = next
	return nil
}

// nextState is what is committed for b's source once b is: its checkpoint
// (the stored one for a batch without: part of a split transaction, whose
// record still marks the transaction as ours), the watermarks, and with
// ControlRecords the partition counts of the source's topics. Callers
// hold s.mu.
func (s *Sink) nextState(b *tidemark.Batch, stored sourceState) sourceState {
	next := sourceState{pos: b.Checkpoint, marks: stored.withWatermarks(b.Watermarks)}
	if next.pos.IsZero() {
		next.pos = stored.pos
	}
	if s.cfg.ControlRecords {
		live := map[string]int32{}
		for name, n := range s.partitions {
			if s.topicOwner[name].source == b.Source {
				live[name] = n
			}
		}
		next.parts, next.counted = stored.withCounts(live), true
	}
	return next
}

// attemptTxn publishes one transaction and commits it. A commit refused
// with PRODUCER_FENCED is a fence; after any other failed commit it learns
// the outcome (resolveCommit): the coordinator finishes or fences the
// transaction, and if the record of this attempt is then in the checkpoint
// topic, the transaction committed.
func (s *Sink) attemptTxn(ctx context.Context, source string, enc *encodedBatch, cp checkpoint) error {
	if s.txnOpen {
		if err := s.abort(ctx); err != nil {
			return err
		}
	}
	rec, err := s.checkpointRecord(source, cp)
	if err != nil {
		return err
	}
	if err := s.cl.BeginTransaction(); err != nil {
		// franz-go refuses every transaction once a produce failed its
		// producer id for good: OUT_OF_ORDER_SEQUENCE_NUMBER (also
		// UNKNOWN_PRODUCER_ID, INVALID_PRODUCER_ID_MAPPING) before
		// KIP-890 part 2, where the abort's EndTxn does not hand out a
		// new producer id (CI at 1bb8d1e, kfake: "begin transaction:
		// producer ID has a fatal, unrecoverable error, err:
		// OUT_OF_ORDER_SEQUENCE_NUMBER"). The transaction was aborted
		// (s.txnOpen is false), so the sink takes the id back as after a
		// refused commit and begins on a new client.
		renewed, rerr := s.renewFailed(ctx)
		if rerr != nil {
			return errors.Join(fmt.Errorf("begin transaction: %w", err), rerr)
		}
		if !renewed {
			return fmt.Errorf("begin transaction: %w", err)
		}
		if err := s.cl.BeginTransaction(); err != nil {
			return fmt.Errorf("begin transaction on a new client: %w", err)
		}
	}
	s.txnOpen = true
	recs := append(enc.records(1), rec)
	if err := s.produceAll(ctx, recs); err != nil {
		if isFenced(err) {
			return err
		}
		if aerr := s.abort(ctx); aerr != nil {
			return errors.Join(err, aerr)
		}
		return err
	}
	if err := s.watch.failed(); err != nil {
		// A record went by another partition count: abort, so that
		// no applier reads it.
		if aerr := s.abort(ctx); aerr != nil {
			return errors.Join(err, aerr)
		}
		return err
	}
	if s.hookBeforeCommit != nil {
		if err := s.hookBeforeCommit(); err != nil {
			return err
		}
	}
	pid, epoch, _ := s.cl.ProducerID(ctx) // loaded: the records were produced with it
	err = s.cl.EndTransaction(ctx, kgo.TryCommit)
	if s.hookCommitResult != nil {
		err = s.hookCommitResult(err)
	}
	if err == nil {
		s.txnOpen = false
		s.lastPID, s.hasLastPID = pid, true
		if s.hookAfterCommit != nil {
			return s.hookAfterCommit()
		}
		return nil
	}
	err = fmt.Errorf("commit transaction: %w", err)
	if isFenced(err) {
		return &fencedError{txnID: s.cfg.TransactionalID, err: err}
	}
	return s.resolveCommit(ctx, source, cp, err, pid, epoch)
}

// resolveCommit learns the outcome of the transaction of cp, whose commit
// failed with commitErr (no answer, or a refusal other than
// PRODUCER_FENCED), before anything more is published: it makes the
// coordinator finish the transaction (settle) and then reads the
// checkpoint back. If the record of this attempt is there, the transaction
// committed (nil). If it is not, the error says so ("verified not
// committed", republished whole when the commit's error or a new client
// makes that worth it). A fence stops. Any other failure is retried, as
// long as a broker restart may take: until cfg.CommitResolveTimeout, or
// until ctx is done but never less than resolveTimeout; then the outcome
// is unknown (*unresolvedCommitError): the pipeline stops and its restart
// reads the checkpoint first.
func (s *Sink) resolveCommit(ctx context.Context, source string, cp checkpoint, commitErr error, pid int64, epoch int16) error {
	rctx, cancel := s.resolveContext(ctx)
	defer cancel()
	settled, renewed := false, false
	var got checkpoint
	b := tidemark.Backoff{Initial: s.cfg.Retry.Initial, Max: s.cfg.Retry.Max}
	err := tidemark.Retry(rctx, "learn the outcome of the commit of "+source, b, func(err error) bool { return !isFenced(err) }, s.rlog, func(ctx context.Context) error {
		if !settled {
			var err error
			if renewed, err = s.settle(ctx, pid, epoch); err != nil {
				return err
			}
			settled = true
		}
		var err error
		got, _, _, err = s.readCheckpoint(ctx, source)
		if err != nil {
			return fmt.Errorf("read checkpoint back: %w", err)
		}
		return nil
	})
	if err != nil {
		if isFenced(err) {
			if _, ok := errors.AsType[*fencedError](err); ok {
				return err
			}
			return &fencedError{txnID: s.cfg.TransactionalID, err: errors.Join(commitErr, err)}
		}
		return &unresolvedCommitError{commitErr: commitErr, resolveErr: err}
	}
	if got.Batch == cp.Batch {
		s.log.Info("commit reported an error but took effect (checkpoint read back)", "source", source, "err", commitErr)
		return nil
	}
	if renewed {
		// The old client could not go on (a refused commit: franz-go
		// failed its producer id for good); the new one can, so the
		// batch is worth publishing again whatever the refusal was.
		return &tidemark.Retryable{Err: fmt.Errorf("%w (verified not committed; publishing it again on a new client)", commitErr)}
	}
	if errors.Is(commitErr, kerr.UnknownServerError) {
		// UNKNOWN_SERVER_ERROR is no answer about the commit: franz-go
		// leaves such a commit unconfirmed and fails the producer id
		// to be reloaded, and settle's reload (an InitProducerID that
		// bumps the epoch and aborts whatever was still open) was
		// accepted, so this client still owns the id and can go on.
		// Apache Kafka 4.4 answered a standby's first commit with it
		// just after the standby fenced the daemon it took the source
		// lock from (nemesis seed 9).
		return &tidemark.Retryable{Err: fmt.Errorf("%w (verified not committed; the producer id was reloaded, publishing it again)", commitErr)}
	}
	return fmt.Errorf("%w (verified not committed)", commitErr)
}

// resolveContext bounds resolveCommit: cfg.CommitResolveTimeout, and once
// ctx is done, resolveTimeout from now at the latest (a stopping daemon
// still tries that long, so that its restart finds the outcome known).
func (s *Sink) resolveContext(ctx context.Context) (context.Context, context.CancelFunc) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.CommitResolveTimeout)
	floor := time.Now().Add(resolveTimeout)
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(time.Until(floor), cancel) })
	return rctx, func() { stop(); cancel() }
}

// settle makes the transaction coordinator finish the transaction whose
// commit failed, so that the checkpoint read back after it is final.
// Aborting is not proof of that: franz-go's abort after a commit that got
// no answer returns without a request when the broker cannot be reached
// (it leaves the producer id to reload). Reloading it is the proof: an
// InitProducerID with the transaction's producer id and epoch (KIP-360)
// returns only once the coordinator has completed (committed or aborted)
// the transaction, and it answers PRODUCER_FENCED when another producer
// initialized the transactional id meanwhile (a fence, which stops).
//
// When franz-go failed the producer id for good (a refused commit, e.g.
// INVALID_TXN_STATE: the coordinator had aborted the transaction on its
// own after transaction_timeout and bumped the epoch), the client cannot
// go on: the sink then sends that InitProducerID itself, with the commit's
// producer id and epoch, and on success replaces the client (renewed).
func (s *Sink) settle(ctx context.Context, pid int64, epoch int16) (renewed bool, _ error) {
	if s.txnOpen {
		if err := s.abort(ctx); err != nil {
			return false, err
		}
	}
	actx, cancel := context.WithTimeout(ctx, abortTimeout)
	defer cancel()
	_, _, failed, err := s.reloadID(actx)
	if err == nil || !failed {
		return false, err
	}
	if err := s.takeBack(actx, pid, epoch, err); err != nil {
		return false, err
	}
	return true, nil
}

// reloadID loads the client's producer id (franz-go reloads one marked for
// reloading). The error is nil when the id is usable, a fence as one;
// failed is set when franz-go failed the id for good (a broker refusal
// that is not retriable), with the failed id's producer id and epoch.
func (s *Sink) reloadID(ctx context.Context) (pid int64, epoch int16, failed bool, _ error) {
	pid, epoch, err := s.cl.ProducerID(ctx)
	if err == nil {
		return pid, epoch, false, nil
	}
	if isFenced(err) {
		return pid, epoch, false, &fencedError{txnID: s.cfg.TransactionalID, err: fmt.Errorf("reload producer id: %w", err)}
	}
	ke, ok := errors.AsType[*kerr.Error](err)
	return pid, epoch, ok && !ke.Retriable, fmt.Errorf("reload producer id: %w", err)
}

// renewFailed replaces the client when franz-go failed its producer id
// for good outside a commit (a produce's refusal that no abort recovers)
// and no transaction is open: it takes the id back with the failed id's
// own producer id and epoch (takeBack). It reports false when the id is
// not failed that way (the caller's error stands), and a fence as one.
func (s *Sink) renewFailed(ctx context.Context) (bool, error) {
	if s.txnOpen {
		return false, nil
	}
	actx, cancel := context.WithTimeout(ctx, abortTimeout)
	defer cancel()
	pid, epoch, failed, err := s.reloadID(actx)
	if isFenced(err) {
		return false, err
	}
	if !failed || pid < 0 {
		return false, nil
	}
	if err := s.takeBack(actx, pid, epoch, err); err != nil {
		return false, err
	}
	return true, nil
}

// takeBack replaces a client whose producer id franz-go failed for good
// (clientErr): the coordinator must show the id as this sink left it
// (ownAbort), an InitProducerID with its producer id and epoch takes it
// back (reclaim, which also completes a transaction still open), and a new
// client goes on.
func (s *Sink) takeBack(ctx context.Context, pid int64, epoch int16, clientErr error) error {
	if err := s.ownAbort(ctx, pid, epoch); err != nil {
		return err
	}
	if err := s.reclaim(ctx, pid, epoch); err != nil {
		if isFenced(err) {
			return &fencedError{txnID: s.cfg.TransactionalID, err: fmt.Errorf("take the producer id back (the client's is failed: %v): %w", clientErr, err)}
		}
		return fmt.Errorf("take the producer id back (the client's is failed: %v): %w", clientErr, err)
	}
	s.log.Info("transaction coordinator gave the producer id back (no other instance took it); going on with a new client",
		"transactional_id", s.cfg.TransactionalID, "producer_id", pid, "epoch", epoch, "client_err", clientErr)
	return s.renewClient()
}

// ownAbort checks, before reclaim, that the coordinator shows the
// transactional id as it leaves it after aborting this sink's transaction
// on its own: the same producer id, the epoch not moved, or moved by one
// with the transaction aborted (CompleteAbort). Another producer that
// initialized the id moved the epoch further, or left it Empty or in a
// transaction of its own: a fence (reclaim would also get PRODUCER_FENCED
// from Apache Kafka, but not from every broker: kfake accepts any older
// epoch). An abort still being completed is retried.
func (s *Sink) ownAbort(ctx context.Context, pid int64, epoch int16) error {
	txns, err := s.adm.DescribeTransactions(ctx, s.cfg.TransactionalID)
	if err != nil {
		return fmt.Errorf("describe transaction: %w", err)
	}
	d, err := txns.On(s.cfg.TransactionalID, nil)
	if err == nil {
		err = d.Err
	}
	if err != nil {
		return fmt.Errorf("describe transaction: %w", err)
	}
	switch {
	case d.ProducerID == pid && d.ProducerEpoch <= epoch:
		return nil
	case d.ProducerID == pid && d.ProducerEpoch == epoch+1 && d.State == "CompleteAbort":
		return nil
	case d.ProducerID == pid && d.ProducerEpoch == epoch+1 && (d.State == "PrepareAbort" || d.State == "PrepareEpochFence"):
		return fmt.Errorf("describe transaction: the coordinator is still aborting it (%s)", d.State)
	}
	return &fencedError{txnID: s.cfg.TransactionalID, err: fmt.Errorf("the transactional id moved on since this producer's transaction (producer id %d epoch %d): now producer id %d epoch %d, %s",
		pid, epoch, d.ProducerID, d.ProducerEpoch, d.State)}
}

// reclaim sends InitProducerID for the transactional id with the producer
// id and epoch of this sink's last transaction (KIP-360): the coordinator
// accepts it (bumping the epoch, and completing that transaction first)
// when that epoch is its current one or the one it bumped from when it
// aborted the transaction on its own, and answers PRODUCER_FENCED when
// another producer has initialized the id since.
func (s *Sink) reclaim(ctx context.Context, pid int64, epoch int16) error {
	txnID := s.cfg.TransactionalID
	for {
		req := kmsg.NewPtrInitProducerIDRequest()
		req.TransactionalID = &txnID
		req.TransactionTimeoutMillis = int32(s.cfg.TransactionTimeout.Milliseconds())
		req.ProducerID, req.ProducerEpoch = pid, epoch
		resp, err := req.RequestWith(ctx, s.cl)
		if err == nil {
			err = kerr.ErrorForCode(resp.ErrorCode)
		}
		if !errors.Is(err, kerr.ConcurrentTransactions) {
			return err
		}
		// The coordinator is still completing the transaction.
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// renewClient replaces the producer client by a new one with the same
// options, which initializes the transactional id again on its first
// transaction. Only after reclaim: the new producer would fence whatever
// holds the id.
func (s *Sink) renewClient() error {
	cl, err := kgo.NewClient(s.kopts...)
	if err != nil {
		return fmt.Errorf("new kafka client: %w", err)
	}
	s.cl.Close()
	s.cl, s.adm = cl, kadm.NewClient(cl)
	s.txnOpen = false
	return nil
}

// abort ends the open transaction with an abort, after failing whatever is
// still buffered. It runs with its own deadline even when ctx is done.
func (s *Sink) abort(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abortTimeout)
	defer cancel()
	if err := s.cl.AbortBufferedRecords(ctx); err != nil {
		return fmt.Errorf("abort transaction: %w", err)
	}
	// A fenced producer must not try to recover its id (PRODUCER_FENCED
	// stays). A producer id failed with INVALID_PRODUCER_EPOCH goes on to
	// EndTransaction: franz-go re-initializes it with its own id and
	// epoch, which the broker refuses with PRODUCER_FENCED when another
	// instance took the id over, and which ends the transaction when the
	// coordinator aborted it on its own (isFenced).
	if _, _, err := s.cl.ProducerID(ctx); isFenced(err) {
		return fmt.Errorf("abort transaction: %w", err)
	}
	if err := s.cl.EndTransaction(ctx, kgo.TryAbort); err != nil {
		if errors.Is(err, kerr.InvalidProducerEpoch) {
			// The abort is what tells the coordinator's own abort
			// (accepted) from another instance's takeover; refused
			// with the old epoch as well, this producer cannot go on
			// (franz-go marks its id failed for good), and retrying
			// would loop until the context ends: a fence, which stops.
			return &fencedError{txnID: s.cfg.TransactionalID, err: fmt.Errorf("abort transaction (refused with the old epoch too): %w", err)}
		}
		return fmt.Errorf("abort transaction: %w", err)
	}
	s.txnOpen = false
	return nil
}

// produceAll produces recs and waits until every one is acknowledged or
// failed; it returns the first failure. Produce blocks while the buffers
// are full.
func (s *Sink) produceAll(ctx context.Context, recs []kgo.Record) error {
	var (
		mu    sync.Mutex
		first error
	)
	promise := func(r *kgo.Record, err error) {
		if err != nil {
			mu.Lock()
			if first == nil {
				first = &produceError{topic: r.Topic, err: err}
			}
			mu.Unlock()
		}
	}
	for i := range recs {
		s.cl.Produce(ctx, &recs[i], promise)
	}
	if err := s.cl.Flush(ctx); err != nil {
		return fmt.Errorf("flush records: %w", err)
	}
	mu.Lock()
	defer mu.Unlock()
	return first
}

// produceError is a record the producer or the broker failed.
type produceError struct {
	topic string
	err   error
}

func (e *produceError) Error() string { return "produce to " + e.topic + ": " + e.err.Error() }
func (e *produceError) Unwrap() error { return e.err }

// tooLarge turns a record of a table's topic that the broker refused as too
// large (MESSAGE_TOO_LARGE: the topic's max.message.bytes or the broker's
// message.max.bytes is below max_record_bytes) into a *tidemark.TableError
// of that table: it is quarantined, the other tables go on. encode refuses
// records above max_record_bytes before anything is produced. Callers hold
// s.mu.
func (s *Sink) tooLarge(err error) error {
	pe, ok := errors.AsType[*produceError](err)
	if !ok || !errors.Is(err, kerr.MessageTooLarge) {
		return nil
	}
	owner, ok := s.topicOwner[pe.topic]
	if !ok {
		return nil
	}
	return &tidemark.TableError{Table: owner.id, Err: fmt.Errorf("publish changes of %s: the broker refused a record as too large for topic %s (its max.message.bytes, or the broker's message.max.bytes, is below max_record_bytes %d): %w",
		owner.id, pe.topic, s.cfg.MaxRecordBytes, err)}
}

// retryBackoff is how long franz-go waits before it retries a request:
// 10 ms, doubling up to 2.5 s, ±20%. Its default starts at 250 ms: the
// first produce to a topic just created gets a retriable answer, and
// waited for a metadata refresh (MetadataMinAge) and then this backoff,
// ~290 ms per new table on the real broker; 85–170 ms with both short
// (TestKafkaNewTopicPartitionsWithoutStaleMetadata, issue 25).
func retryBackoff(fails int) time.Duration {
	d := 10 * time.Millisecond << min(max(fails-1, 0), 8)
	d = min(d, 2500*time.Millisecond)
	return time.Duration(float64(d) * (0.8 + 0.4*mathrand.Float64()))
}

func (s *Sink) checkpointRecord(source string, cp checkpoint) (kgo.Record, error) {
	v, err := cp.append(nil)
	return kgo.Record{Topic: s.cfg.CheckpointTopic, Key: []byte(source), Value: v}, err
}

func (s *Sink) nextBatchID() string {
	s.attempts++
	return s.instance + "-" + strconv.FormatUint(s.attempts, 10)
}

const (
	// metadataMinAge is the least time between two metadata refreshes of
	// the producer.
	metadataMinAge = 100 * time.Millisecond
	// leaderWait bounds the wait for the leaders of a topic's partitions
	// after creating it.
	leaderWait = 10 * time.Second
	// resolveTimeout is how long resolveCommit goes on once the context
	// of Apply is done.
	resolveTimeout = 30 * time.Second
	// abortTimeout bounds aborting a transaction.
	abortTimeout = 30 * time.Second
)

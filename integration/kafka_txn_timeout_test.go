package integration

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"tidemark"
	"tidemark/internal/testenv"
	"tidemark/sink/kafka"
)

// stallHandler is a slog handler for the Kafka sink's log. Once armed, it
// runs stall in the goroutine that logs its next line with message msg
// (franz-go's, routed into the sink's logger at debug level), which holds
// what that goroutine was about to do:
//   - "immediate metadata update triggered" (franz-go's metadata
//     goroutine): a topic the producer has not produced to yet cannot be
//     resolved meanwhile, so its records wait while those of known topics
//     go on;
//   - "ending transaction" (the goroutine of Apply, in EndTransaction just
//     before the EndTxn request): the commit waits.
type stallHandler struct {
	msg   string
	armed atomic.Bool
	stall func()
}

func (h *stallHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *stallHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *stallHandler) WithGroup(string) slog.Handler            { return h }
func (h *stallHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg && h.armed.CompareAndSwap(true, false) {
		h.stall()
	}
	return nil
}

// txnTimeoutCase is a Kafka sink (exactly once, the real broker,
// transaction_timeout 1 s) whose transaction a stallHandler holds open until
// the broker's transaction coordinator aborts it on its own and bumps the
// producer epoch, as it does for a transaction left open across a broker
// restart (soak seed 710275764579).
type txnTimeoutCase struct {
	t               *testing.T
	ctx             context.Context
	brokers         []string
	db, prefix      string
	s               *kafka.Sink
	h               *stallHandler
	aborted         bool // the coordinator aborted the held transaction
	ta, tb          *tidemark.Table
	open            func(log *slog.Logger) *kafka.Sink
	change          func(tbl *tidemark.Table, seq uint64, id int64) tidemark.Change
	applyCheckpoint func(s *kafka.Sink, gtid string, changes ...tidemark.Change) error
}

func newTxnTimeoutCase(t *testing.T, stallAt string) *txnTimeoutCase {
	f := newFixture(t)
	c := &txnTimeoutCase{t: t, brokers: f.kafka(t)}
	c.db = testenv.Name("txto_")
	txn := "txn-" + c.db
	c.prefix = "tk" + c.db
	admCl, err := kgo.NewClient(kgo.SeedBrokers(c.brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admCl.Close)
	adm := kadm.NewClient(admCl)
	ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
	t.Cleanup(cancel)
	c.ctx = ctx
	// The stall: the held transaction until the coordinator aborted it.
	c.h = &stallHandler{msg: stallAt, stall: func() {
		c.aborted = testenv.WaitFor(120*time.Second, func() bool {
			dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
			defer dcancel()
			txns, err := adm.DescribeTransactions(dctx, txn)
			if err != nil {
				return false
			}
			d, err := txns.On(txn, nil)
			return err == nil && d.Err == nil && d.State == "CompleteAbort"
		})
	}}
	c.open = func(log *slog.Logger) *kafka.Sink {
		ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
		defer cancel()
		s, err := kafka.Open(ctx, kafka.Config{Brokers: c.brokers, TopicPrefix: c.prefix, CreateTopics: true, ExactlyOnce: true,
			TransactionalID: txn, TransactionTimeout: time.Second, Logger: log,
			Retry: tidemark.Backoff{Initial: 10 * time.Millisecond, Max: 200 * time.Millisecond}})
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	c.s = c.open(slog.New(c.h))
	table := func(name string) *tidemark.Table {
		return &tidemark.Table{ID: tidemark.TableID{Database: c.db, Name: name},
			Columns: []tidemark.Column{{Name: "id", Kind: tidemark.KindInt, Bits: 32}, {Name: "v", Kind: tidemark.KindText, Nullable: true}}, Key: []int{0}}
	}
	c.ta, c.tb = table("a"), table("b")
	c.change = func(tbl *tidemark.Table, seq uint64, id int64) tidemark.Change {
		return tidemark.Change{Table: tbl, Op: tidemark.OpInsert, Version: tidemark.Version{Seq: seq, Index: 1},
			CommitTime: time.Now().UTC().Truncate(time.Second), After: []any{id, "row"}, Size: 50}
	}
	c.applyCheckpoint = func(s *kafka.Sink, gtid string, changes ...tidemark.Change) error {
		_, err := s.Apply(ctx, &tidemark.Batch{Source: c.db, Checkpoint: tidemark.Position{GTID: gtid}, Changes: changes})
		return err
	}
	return c
}

// check verifies the outcome after the held batch 0-1-2: the checkpoint is
// the batch's, every change in want is seen once on a read_committed
// consumer, and a second instance that does take the transactional id over
// still fences the first (ErrFenced, a loud stop).
func (c *txnTimeoutCase) check(want ...string) {
	t := c.t
	if !c.aborted {
		t.Fatal("the coordinator never aborted the held transaction: the test did not test it")
	}
	pos, ok, err := c.s.Checkpoint(c.ctx, c.db)
	if err != nil || !ok || pos.GTID != "0-1-2" {
		t.Fatalf("checkpoint = %s, %v, %v, want 0-1-2", pos, ok, err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.brokers...), kgo.ConsumeTopics(c.prefix+"."+c.db+".a", c.prefix+"."+c.db+".b"),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	seen := map[string]int{}
	testenv.WaitFor(60*time.Second, func() bool {
		pctx, pcancel := context.WithTimeout(c.ctx, 2*time.Second)
		defer pcancel()
		cl.PollFetches(pctx).EachRecord(func(r *kgo.Record) {
			if r.Value != nil && len(r.Headers) > 0 {
				seen[r.Topic+" "+string(r.Key)]++
			}
		})
		return len(seen) >= len(want)
	})
	for _, k := range want {
		if k = c.prefix + "." + c.db + "." + k; seen[k] != 1 {
			t.Errorf("record %s seen %d times, want 1 (all: %v)", k, seen[k], seen)
		}
	}
	if len(seen) != len(want) {
		t.Errorf("records seen: %v, want %v", seen, want)
	}
	r := c.open(slog.New(slog.DiscardHandler))
	if err := r.Activate(c.ctx); err != nil {
		t.Fatalf("activate the second instance: %v", err)
	}
	if err := c.applyCheckpoint(c.s, "0-1-3", c.change(c.ta, 3, 4)); !errors.Is(err, kafka.ErrFenced) {
		t.Fatalf("apply on the instance taken over: %v, want ErrFenced", err)
	}
	if err := c.applyCheckpoint(r, "0-1-3", c.change(c.ta, 3, 4)); err != nil {
		t.Fatalf("apply on the instance that took over: %v", err)
	}
}

// TestKafkaTransactionAbortedByCoordinatorRecovers holds a transaction open
// while it produces (a record of a topic new to the producer waits for
// metadata) until the coordinator aborts it: the records still to go then
// get INVALID_PRODUCER_EPOCH. No other instance holds the transactional id,
// so the sink must abort, publish the batch again and commit it.
func TestKafkaTransactionAbortedByCoordinatorRecovers(t *testing.T) {
	c := newTxnTimeoutCase(t, "immediate metadata update triggered")
	// Batch 1: table a only.
	if err := c.applyCheckpoint(c.s, "0-1-1", c.change(c.ta, 1, 1)); err != nil {
		t.Fatalf("apply batch 1: %v", err)
	}
	// Batch 2: a's record opens the transaction, b's (a topic new to the
	// producer) waits for metadata until the coordinator aborted it.
	c.h.armed.Store(true)
	if err := c.applyCheckpoint(c.s, "0-1-2", c.change(c.ta, 2, 2), c.change(c.tb, 2, 3)); err != nil {
		t.Fatalf("apply batch 2 after the coordinator aborted its transaction (no other instance): %v", err)
	}
	c.check(`a {"id":1}`, `a {"id":2}`, `b {"id":3}`)
}

// TestKafkaCommitAfterCoordinatorAbortRecovers holds a transaction whose
// records are all produced just before its commit (EndTxn) until the
// coordinator aborts it: the commit, sent then, is answered
// INVALID_TXN_STATE (Apache Kafka 4.4), the producer epoch has moved and
// franz-go refuses new transactions on that client. No other instance holds
// the transactional id, so the sink must learn that (the coordinator still
// takes its producer id and epoch back), verify that the batch did not
// commit, and publish it again whole on a new client.
func TestKafkaCommitAfterCoordinatorAbortRecovers(t *testing.T) {
	c := newTxnTimeoutCase(t, "ending transaction")
	if err := c.applyCheckpoint(c.s, "0-1-1", c.change(c.ta, 1, 1), c.change(c.tb, 1, 2)); err != nil {
		t.Fatalf("apply batch 1: %v", err)
	}
	c.h.armed.Store(true)
	if err := c.applyCheckpoint(c.s, "0-1-2", c.change(c.ta, 2, 3), c.change(c.tb, 2, 4)); err != nil {
		t.Fatalf("apply batch 2 whose commit came after the coordinator aborted its transaction (no other instance): %v", err)
	}
	c.check(`a {"id":1}`, `b {"id":2}`, `a {"id":3}`, `b {"id":4}`)
}

// TestKafkaCommitAfterTakeoverFences holds a commit as
// TestKafkaCommitAfterCoordinatorAbortRecovers does, but while it is held a
// second instance takes the transactional id over: the held commit must
// then stop the first instance with ErrFenced, not take the id back, and
// the second goes on from the first's last commit.
func TestKafkaCommitAfterTakeoverFences(t *testing.T) {
	c := newTxnTimeoutCase(t, "ending transaction")
	if err := c.applyCheckpoint(c.s, "0-1-1", c.change(c.ta, 1, 1)); err != nil {
		t.Fatalf("apply batch 1: %v", err)
	}
	var r *kafka.Sink
	c.h.stall = func() {
		r = c.open(slog.New(slog.DiscardHandler))
		if err := r.Activate(c.ctx); err != nil {
			t.Errorf("activate the second instance: %v", err)
		}
	}
	c.h.armed.Store(true)
	if err := c.applyCheckpoint(c.s, "0-1-2", c.change(c.ta, 2, 2)); !errors.Is(err, kafka.ErrFenced) {
		t.Fatalf("apply batch 2 whose commit came after another instance took the id over: %v, want ErrFenced", err)
	}
	if r == nil {
		t.Fatal("the commit was never held: the test did not test it")
	}
	pos, ok, err := r.Checkpoint(c.ctx, c.db)
	if err != nil || !ok || pos.GTID != "0-1-1" {
		t.Fatalf("checkpoint = %s, %v, %v, want 0-1-1", pos, ok, err)
	}
	if err := c.applyCheckpoint(r, "0-1-2", c.change(c.ta, 2, 2)); err != nil {
		t.Fatalf("apply on the instance that took over: %v", err)
	}
	if err := c.applyCheckpoint(c.s, "0-1-3", c.change(c.ta, 3, 3)); !errors.Is(err, kafka.ErrFenced) {
		t.Fatalf("apply on the fenced instance: %v, want ErrFenced", err)
	}
}

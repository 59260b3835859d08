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
// runs stall in franz-go's metadata goroutine at its next "immediate
// metadata update triggered" line: a topic the producer has not produced to
// yet cannot be resolved meanwhile, so its records wait while those of
// known topics go on.
type stallHandler struct {
	armed atomic.Bool
	stall func()
}

func (h *stallHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *stallHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *stallHandler) WithGroup(string) slog.Handler            { return h }
func (h *stallHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "immediate metadata update triggered" && h.armed.CompareAndSwap(true, false) {
		h.stall()
	}
	return nil
}

// TestKafkaTransactionAbortedByCoordinatorRecovers holds a transaction of
// the Kafka sink (exactly once, the real broker, transaction_timeout 1 s)
// open until the broker's transaction coordinator aborts it and bumps the
// producer epoch, as it does for a transaction left open across a broker
// restart (soak seed 710275764579): the records still to go then get
// INVALID_PRODUCER_EPOCH. No other instance holds the transactional id, so
// the sink must abort, publish the batch again and commit it: every change
// once on a read_committed consumer, the checkpoint the batch's. A second
// instance that does take the transactional id over still fences the first
// (ErrFenced, a loud stop).
func TestKafkaTransactionAbortedByCoordinatorRecovers(t *testing.T) {
	f := newFixture(t)
	brokers := f.kafka(t)
	db := testenv.Name("txto_")
	prefix, txn := "tk"+db, "txn-"+db
	admCl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer admCl.Close()
	adm := kadm.NewClient(admCl)
	// The stall: the held transaction until the coordinator aborted it.
	ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
	defer cancel()
	aborted := false
	stall := func() {
		aborted = testenv.WaitFor(120*time.Second, func() bool {
			dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
			defer dcancel()
			txns, err := adm.DescribeTransactions(dctx, txn)
			if err != nil {
				return false
			}
			d, err := txns.On(txn, nil)
			return err == nil && d.Err == nil && d.State == "CompleteAbort"
		})
	}
	h := &stallHandler{stall: stall}
	open := func(log *slog.Logger) *kafka.Sink {
		ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
		defer cancel()
		s, err := kafka.Open(ctx, kafka.Config{Brokers: brokers, TopicPrefix: prefix, CreateTopics: true, ExactlyOnce: true,
			TransactionalID: txn, TransactionTimeout: time.Second, Logger: log,
			Retry: tidemark.Backoff{Initial: 10 * time.Millisecond, Max: 200 * time.Millisecond}})
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	s := open(slog.New(h))
	table := func(name string) *tidemark.Table {
		return &tidemark.Table{ID: tidemark.TableID{Database: db, Name: name},
			Columns: []tidemark.Column{{Name: "id", Kind: tidemark.KindInt, Bits: 32}, {Name: "v", Kind: tidemark.KindText, Nullable: true}}, Key: []int{0}}
	}
	ta, tb := table("a"), table("b")
	change := func(tbl *tidemark.Table, seq uint64, id int64) tidemark.Change {
		return tidemark.Change{Table: tbl, Op: tidemark.OpInsert, Version: tidemark.Version{Seq: seq, Index: 1},
			CommitTime: time.Now().UTC().Truncate(time.Second), After: []any{id, "row"}, Size: 50}
	}
	// Batch 1: table a only .
	if _, err := s.Apply(ctx, &tidemark.Batch{Source: db, Checkpoint: tidemark.Position{GTID: "0-1-1"},
		Changes: []tidemark.Change{change(ta, 1, 1)}}); err != nil {
		t.Fatalf("apply batch 1: %v", err)
	}
	// Batch 2: a's record opens the transaction, b's (a topic new to the
	// producer) waits for metadata until the coordinator aborted it.
	h.armed.Store(true)
	if _, err := s.Apply(ctx, &tidemark.Batch{Source: db, Checkpoint: tidemark.Position{GTID: "0-1-2"},
		Changes: []tidemark.Change{change(ta, 2, 2), change(tb, 2, 3)}}); err != nil {
		t.Fatalf("apply batch 2 after the coordinator aborted its transaction (no other instance): %v", err)
	}
	if !aborted {
		t.Fatal("the coordinator never aborted the held transaction: the test did not test it")
	}
	pos, ok, err := s.Checkpoint(ctx, db)
	if err != nil || !ok || pos.GTID != "0-1-2" {
		t.Fatalf("checkpoint = %s, %v, %v, want 0-1-2", pos, ok, err)
	}
	// Every change once on a read_committed consumer.
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(prefix+"."+db+".a", prefix+"."+db+".b"),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	seen := map[string]int{}
	testenv.WaitFor(60*time.Second, func() bool {
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		defer pcancel()
		cl.PollFetches(pctx).EachRecord(func(r *kgo.Record) {
			if r.Value != nil && len(r.Headers) > 0 {
				seen[r.Topic+" "+string(r.Key)]++
			}
		})
		return len(seen) >= 3
	})
	want := map[string]int{prefix + "." + db + ".a " + `{"id":1}`: 1, prefix + "." + db + ".a " + `{"id":2}`: 1, prefix + "." + db + ".b " + `{"id":3}`: 1}
	for k, n := range want {
		if seen[k] != n {
			t.Errorf("record %s seen %d times, want %d (all: %v)", k, seen[k], n, seen)
		}
	}
	// A real takeover still fences the first instance.
	r := open(slog.New(slog.DiscardHandler))
	if err := r.Activate(ctx); err != nil {
		t.Fatalf("activate the second instance: %v", err)
	}
	_, err = s.Apply(ctx, &tidemark.Batch{Source: db, Checkpoint: tidemark.Position{GTID: "0-1-3"}, Changes: []tidemark.Change{change(ta, 3, 4)}})
	if !errors.Is(err, kafka.ErrFenced) {
		t.Fatalf("apply on the instance taken over: %v, want ErrFenced", err)
	}
	if _, err := r.Apply(ctx, &tidemark.Batch{Source: db, Checkpoint: tidemark.Position{GTID: "0-1-3"}, Changes: []tidemark.Change{change(ta, 3, 4)}}); err != nil {
		t.Fatalf("apply on the instance that took over: %v", err)
	}
}

package integration

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"tidemark/internal/testenv"
	"tidemark/sink/kafka"
)

// TestKafkaCheckpointReadBackAfterFirstCommit commits a first batch on a
// freshly created checkpoint topic (exactly once, the real broker) and reads
// the checkpoint back at once, 30 times on 30 fresh topics: the read must
// return the committed position, never "no checkpoint". Kafka's EndTxn
// answers before the commit marker is in the partition, so a read right
// after the commit can find the record with its transaction still open.
// Each time a second instance (a restarted daemon: Activate, then
// Checkpoint) must read the same position.
func TestKafkaCheckpointReadBackAfterFirstCommit(t *testing.T) {
	f := newFixture(t)
	brokers := f.kafka(t)
	open := func(t *testing.T, prefix, txn string) *kafka.Sink {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
		defer cancel()
		s, err := kafka.Open(ctx, kafka.Config{Brokers: brokers, TopicPrefix: prefix, CreateTopics: true, ExactlyOnce: true,
			TransactionalID: txn, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	var misses []string
	for i := range 30 {
		db := testenv.Name("cpr_")
		s := open(t, "tk"+db, "txn-"+db)
		ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
		b := tlsBatch(db, uint64(i+1))
		if _, err := s.Apply(ctx, b); err != nil {
			cancel()
			t.Fatalf("apply %d: %v", i, err)
		}
		pos, ok, err := s.Checkpoint(ctx, b.Source)
		if err != nil || !ok || pos.GTID != b.Checkpoint.GTID {
			misses = append(misses, "same instance: "+db+": "+pos.String()+" ok="+boolStr(ok)+" err="+errStr(err))
		}
		r := open(t, "tk"+db, "txn-"+db)
		if err := r.Activate(ctx); err != nil {
			cancel()
			t.Fatalf("activate %d: %v", i, err)
		}
		pos, ok, err = r.Checkpoint(ctx, b.Source)
		if err != nil || !ok || pos.GTID != b.Checkpoint.GTID {
			misses = append(misses, "restarted: "+db+": "+pos.String()+" ok="+boolStr(ok)+" err="+errStr(err))
		}
		cancel()
	}
	if len(misses) > 0 {
		t.Fatalf("%d of 60 read-backs right after the first commit did not return it, want 0:\n%v", len(misses), misses)
	}
}

func boolStr(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

func errStr(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// TestKafkaCheckpointReadByToolWaitsForOpenTransaction: a one-shot tool
// (`tidemark checkpoint`, doctor, catchup) opens the sink without taking
// over the transactional id, so a running tailer's transaction may be open
// while it reads. Another producer holds such a transaction on the
// checkpoint topic with a newer record of the source: the tool's read must
// wait for it to end and return the newer position once it commits, and,
// while it stays open, end with an error naming the offset and the
// producer, never answer with the older checkpoint as if it were current.
func TestKafkaCheckpointReadByToolWaitsForOpenTransaction(t *testing.T) {
	f := newFixture(t)
	brokers := f.kafka(t)
	db := testenv.Name("cpt_")
	prefix := "tk" + db
	open := func(t *testing.T) *kafka.Sink {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
		defer cancel()
		s, err := kafka.Open(ctx, kafka.Config{Brokers: brokers, TopicPrefix: prefix, CreateTopics: true, ExactlyOnce: true,
			TransactionalID: "txn-" + db, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	tailer := open(t)
	first := tlsBatch(db, 1)
	if _, err := tailer.Apply(ctx, first); err != nil {
		t.Fatalf("apply: %v", err)
	}
	other, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.TransactionalID("other-"+db))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	// begin opens a transaction of the other producer holding a newer
	// checkpoint record of the source.
	begin := func(gtid string) {
		t.Helper()
		if err := other.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		rec := &kgo.Record{Topic: prefix + ".checkpoints", Key: []byte(db), Value: []byte(`{"position":"gtid=` + gtid + `","batch":"other"}`)}
		if err := other.ProduceSync(ctx, rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	tool := open(t) // never activated, as `tidemark checkpoint` opens it
	begin("0-1-2")
	go func() {
		time.Sleep(2 * time.Second)
		if err := other.EndTransaction(ctx, kgo.TryCommit); err != nil {
			t.Errorf("commit the other producer's transaction: %v", err)
		}
	}()
	pos, ok, err := tool.Checkpoint(ctx, db)
	if err != nil || !ok || pos.GTID != "0-1-2" {
		t.Fatalf("a tool read while another producer's transaction (committed 2 s later) held checkpoint 0-1-2: got %q ok=%v err=%v, want 0-1-2 (the older %s is not current)", pos.String(), ok, err, first.Checkpoint.GTID)
	}
	begin("0-1-3")
	defer other.EndTransaction(context.Background(), kgo.TryAbort)
	start := time.Now()
	pos, ok, err = tool.Checkpoint(ctx, db)
	if err == nil || !strings.Contains(err.Error(), "producer id") || !strings.Contains(err.Error(), prefix+".checkpoints/0@") {
		t.Fatalf("a tool read while another producer's transaction stays open with checkpoint 0-1-3: got %q ok=%v err=%v after %s, want an error naming the offset and the producer", pos.String(), ok, err, time.Since(start).Round(time.Millisecond))
	}
	t.Logf("open transaction: %v (after %s)", err, time.Since(start).Round(time.Millisecond))
}

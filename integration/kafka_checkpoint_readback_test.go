package integration

import (
	"context"
	"log/slog"
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

// TestKafkaCheckpointReadBeforeActivateIgnoresOthersOpenTransaction: a
// daemon restarted right after kill -9 reads the checkpoint before it takes
// over the transactional id (to seed its tailer; it reads again after
// Activate, which finishes the killed instance's transaction). Another
// producer's transaction left open on the checkpoint topic — the killed
// instance's, which the broker aborts only after its transaction timeout —
// must not make that read fail or wait: it answers with what committed.
// (A read that waited for it stopped every restart within the timeout:
// nemesis soak seeds 309020989641, 381136639836, 217018455821, 974100187202.)
func TestKafkaCheckpointReadBeforeActivateIgnoresOthersOpenTransaction(t *testing.T) {
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
	first := tlsBatch(db, 1)
	if _, err := open(t).Apply(ctx, first); err != nil {
		t.Fatalf("apply: %v", err)
	}
	other, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.TransactionalID("other-"+db))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := other.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	defer other.EndTransaction(context.Background(), kgo.TryAbort)
	rec := &kgo.Record{Topic: prefix + ".checkpoints", Key: []byte(db), Value: []byte(`{"position":"gtid=0-1-2","batch":"other"}`)}
	if err := other.ProduceSync(ctx, rec).FirstErr(); err != nil {
		t.Fatal(err)
	}
	restarted := open(t) // not activated yet, as the daemon's first read
	start := time.Now()
	pos, ok, err := restarted.Checkpoint(ctx, db)
	if err != nil || !ok || pos.GTID != first.Checkpoint.GTID {
		t.Fatalf("a read before Activate beside another producer's open transaction: got %q ok=%v err=%v after %s, want the committed %s", pos.String(), ok, err, time.Since(start).Round(time.Millisecond), first.Checkpoint.GTID)
	}
}

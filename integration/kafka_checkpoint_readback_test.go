package integration

import (
	"context"
	"log/slog"
	"testing"
	"time"

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

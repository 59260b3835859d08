package main

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"

	"tidemark"
	"tidemark/sink/kafka"
)

// TestNeedNamesTargetAndCapability: a capability a command needs and the
// target lacks is one error naming the command, the target's config
// section and the root interface; one it has is returned.
func TestNeedNamesTargetAndCapability(t *testing.T) {
	bare := stateTarget{name: "clickhouse", sink: &stubSink{}}
	_, err := need[tidemark.TableRegistry](bare, "tidemark resync")
	if err == nil {
		t.Fatal("a sink without table states passed as a tidemark.TableRegistry")
	}
	for _, want := range []string{"tidemark resync", "target.clickhouse", "tidemark.TableRegistry", "SetTableState"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	if _, err := need[tidemark.TableRegistry](stateTarget{}, "tidemark status"); err == nil || !strings.Contains(err.Error(), "target.postgres") {
		t.Errorf("no state target: error %v, want one naming target.postgres", err)
	}
	s, err := need[tidemark.Sink](bare, "tidemark checkpoint")
	if err != nil || s != bare.sink {
		t.Fatalf("need of a capability the target has: %v, %v", s, err)
	}
}

// TestNeedCatchUp: a daemon wired without a catch-up (its target stores no
// watermarks and the fallback is off) refuses a command that needs one,
// naming the target.
func TestNeedCatchUp(t *testing.T) {
	d := &daemon{targetName: "target.kafka"}
	_, err := d.needCatchUp("tidemark catchup")
	if err == nil || !strings.Contains(err.Error(), "target.kafka") || !strings.Contains(err.Error(), "tidemark.WatermarkStore") {
		t.Fatalf("error %v, want one naming target.kafka and tidemark.WatermarkStore", err)
	}
}

// stubSink is a sink of function fields standing in for PostgreSQL.
type stubSink struct {
	checkpoint func(ctx context.Context, source string) (tidemark.Position, bool, error)
}

func (s *stubSink) Apply(ctx context.Context, b *tidemark.Batch) (tidemark.ApplyStats, error) {
	return tidemark.ApplyStats{Inserted: len(b.Changes)}, nil
}
func (s *stubSink) Checkpoint(ctx context.Context, source string) (tidemark.Position, bool, error) {
	return s.checkpoint(ctx, source)
}
func (s *stubSink) Close() error { return nil }

func TestWithKafka(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx := context.Background()
	kc := &KafkaConfig{Brokers: c.ListenAddrs(), TopicPrefix: "wk", ExactlyOnce: true}
	pg := &stubSink{checkpoint: func(context.Context, string) (tidemark.Position, bool, error) {
		return tidemark.Position{GTID: "0-1-9"}, true, nil
	}}

	var none closers
	if _, err := withKafka(ctx, nil, nil, "main", log, &none); err == nil {
		t.Error("no target: no error")
	}
	if s, err := withKafka(ctx, pg, nil, "main", log, &none); err != nil || s != tidemark.Sink(pg) {
		t.Errorf("postgres only = %T, %v", s, err)
	}
	var alone closers
	s, err := withKafka(ctx, nil, kc, "main", log, &alone)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.(*kafka.Sink); !ok {
		t.Errorf("kafka only = %T", s)
	}
	// Publish a batch with kafka alone, so kafka has a checkpoint newer
	// than PostgreSQL's.
	if _, err := s.Apply(ctx, &tidemark.Batch{Source: "main", Checkpoint: tidemark.Position{GTID: "0-1-12"}}); err != nil {
		t.Fatal(err)
	}
	alone.close()

	var cl closers
	defer cl.close()
	both, err := withKafka(ctx, pg, kc, "main", log, &cl)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := both.(kafkaFanout); !ok {
		t.Fatalf("both = %T", both)
	}
	if len(none.fns) != 0 || len(cl.fns) != 1 {
		t.Errorf("closers pushed: %d without Kafka, %d with it; want 0 and 1 (Kafka's, not pg's: its opener closes it)", len(none.fns), len(cl.fns))
	}
	pos, ok, err := both.Checkpoint(ctx, "main")
	if err != nil || !ok || pos.GTID != "0-1-9" {
		t.Errorf("both: checkpoint %s, %v, %v; want the older one, 0-1-9 (postgres)", pos, ok, err)
	}
}

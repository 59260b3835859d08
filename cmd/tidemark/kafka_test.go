package main

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"

	"tidemark"
	"tidemark/sink/kafka"
)

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

	if _, err := withKafka(ctx, nil, nil, "main", log); err == nil {
		t.Error("no target: no error")
	}
	if s, err := withKafka(ctx, pg, nil, "main", log); err != nil || s != tidemark.Sink(pg) {
		t.Errorf("postgres only = %T, %v", s, err)
	}
	s, err := withKafka(ctx, nil, kc, "main", log)
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
	s.Close()

	both, err := withKafka(ctx, pg, kc, "main", log)
	if err != nil {
		t.Fatal(err)
	}
	defer both.Close()
	if _, ok := both.(*tidemark.Fanout); !ok {
		t.Fatalf("both = %T", both)
	}
	pos, ok, err := both.Checkpoint(ctx, "main")
	if err != nil || !ok || pos.GTID != "0-1-9" {
		t.Errorf("both: checkpoint %s, %v, %v; want the older one, 0-1-9 (postgres)", pos, ok, err)
	}
}

package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"go.yaml.in/yaml/v3"

	"tidemark"
	"tidemark/sink/kafka"
)

func TestKafkaConfigYAML(t *testing.T) {
	doc := `
kafka:
  brokers: ["127.0.0.1:9092"]
  topic_prefix: shop
  tombstones: true
  exactly_once: true
  transaction_timeout: 30s
  partitions: 6
  topic_configs: {cleanup.policy: compact}
  source_server_id: 1001
`
	var c struct {
		Kafka KafkaConfig `yaml:"kafka"`
	}
	dec := yaml.NewDecoder(bytes.NewReader([]byte(doc)))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		t.Fatal(err)
	}
	got := c.Kafka.SinkConfig("main", nil)
	if !got.ExactlyOnce || got.TransactionalID != "tidemark-main" || !got.CreateTopics || !got.Tombstones ||
		got.TransactionTimeout != 30*time.Second || got.Partitions != 6 || got.TopicConfigs["cleanup.policy"] != "compact" ||
		got.SourceServerID != 1001 || got.TopicPrefix != "shop" {
		t.Errorf("SinkConfig = %+v", got)
	}
	if err := c.Kafka.Validate("main"); err != nil {
		t.Errorf("Validate: %v", err)
	}
}

func TestKafkaConfigValidate(t *testing.T) {
	no := false
	tests := []struct {
		name string
		k    KafkaConfig
		want string
	}{
		{"ok", KafkaConfig{Brokers: []string{"k:9092"}, CreateTopics: &no}, ""},
		{"brokers", KafkaConfig{}, "config: target.kafka.brokers: required"},
		{"template", KafkaConfig{Brokers: []string{"k:9092"}, TopicTemplate: "{db}.{table}"}, "config: target.kafka.topic_template: unknown placeholder"},
		{"buffer", KafkaConfig{Brokers: []string{"k:9092"}, MaxBufferedBytes: 100}, "config: target.kafka.max_buffered_bytes: must be at least 1 MiB"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.k.Validate("main")
			if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("Validate = %v, want %q", err, tt.want)
			}
		})
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

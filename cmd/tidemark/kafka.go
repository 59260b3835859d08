package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"tidemark"
	"tidemark/sink/kafka"
)

// KafkaConfig is the target.kafka section of the config file: publish the
// changes to Kafka (see docs/kafka.md). With target.postgres also set, both
// sinks get every batch (PostgreSQL first, Kafka last) and tidemark resumes
// from the older of their checkpoints.
//
//	target:
//	  kafka:
//	    brokers: ["kafka-1:9092", "kafka-2:9092"]
//	    topic_prefix: shop                  # {prefix} in topic_template (default tidemark)
//	    topic_template: "{prefix}.{database}.{table}"
//	    checkpoint_topic: shop.checkpoints  # default <topic_prefix>.checkpoints
//	    tombstones: true                    # a null-value record after each delete
//	    exactly_once: true                  # one transaction per batch
//	    transactional_id: tidemark-shop     # default tidemark-<source.name>
//	    create_topics: true                 # default true
//	    partitions: 6
//	    replication_factor: 3
//	    topic_configs: {cleanup.policy: compact}
//	    source_server_id: 1001              # published in source.server_id
type KafkaConfig struct {
	Brokers            []string          `yaml:"brokers"`
	ClientID           string            `yaml:"client_id"`
	TopicPrefix        string            `yaml:"topic_prefix"`
	TopicTemplate      string            `yaml:"topic_template"`
	CheckpointTopic    string            `yaml:"checkpoint_topic"`
	Tombstones         bool              `yaml:"tombstones"`
	ExactlyOnce        bool              `yaml:"exactly_once"`
	TransactionalID    string            `yaml:"transactional_id"`
	TransactionTimeout time.Duration     `yaml:"transaction_timeout"`
	CreateTopics       *bool             `yaml:"create_topics"`
	Partitions         int32             `yaml:"partitions"`
	ReplicationFactor  int16             `yaml:"replication_factor"`
	TopicConfigs       map[string]string `yaml:"topic_configs"`
	MaxBufferedRecords int               `yaml:"max_buffered_records"`
	MaxBufferedBytes   int               `yaml:"max_buffered_bytes"`
	MaxRecordBytes     int32             `yaml:"max_record_bytes"`
	SourceServerID     uint32            `yaml:"source_server_id"`
	// ControlRecords announces table schemas on every partition (needed
	// by `tidemark apply`; always on with an apply section).
	ControlRecords bool `yaml:"control_records"`
}

// SinkConfig builds the Kafka sink's config for the source named source
// (the default transactional id is "tidemark-<source>").
func (k *KafkaConfig) SinkConfig(source string, log *slog.Logger) kafka.Config {
	create := true
	if k.CreateTopics != nil {
		create = *k.CreateTopics
	}
	txnID := k.TransactionalID
	if txnID == "" && k.ExactlyOnce {
		txnID = "tidemark-" + source
	}
	return kafka.Config{
		Brokers:            k.Brokers,
		ClientID:           k.ClientID,
		TopicPrefix:        k.TopicPrefix,
		TopicTemplate:      k.TopicTemplate,
		CheckpointTopic:    k.CheckpointTopic,
		Tombstones:         k.Tombstones,
		ExactlyOnce:        k.ExactlyOnce,
		TransactionalID:    txnID,
		TransactionTimeout: k.TransactionTimeout,
		CreateTopics:       create,
		Partitions:         k.Partitions,
		ReplicationFactor:  k.ReplicationFactor,
		TopicConfigs:       k.TopicConfigs,
		MaxBufferedRecords: k.MaxBufferedRecords,
		MaxBufferedBytes:   k.MaxBufferedBytes,
		MaxRecordBytes:     k.MaxRecordBytes,
		SourceServerID:     k.SourceServerID,
		ControlRecords:     k.ControlRecords,
		Logger:             log,
	}
}

// Validate checks the section; errors name the field as
// "config: target.kafka.<field>". It opens no connection.
func (k *KafkaConfig) Validate(source string) error {
	err := kafka.ValidateConfig(k.SinkConfig(source, nil))
	var ce *kafka.ConfigError
	if errors.As(err, &ce) {
		return fmt.Errorf("config: target.kafka.%s: %s", ce.Field, ce.Problem)
	}
	return err
}

// withKafka returns the sink the pipeline applies to, given the PostgreSQL
// sink (nil when target.postgres is not configured; pass an untyped nil, not
// a typed nil pointer) and the target.kafka section (nil when not
// configured):
//
//   - postgres only: pg;
//   - kafka only: the Kafka sink;
//   - both: a tidemark.Fanout applying each batch to PostgreSQL, then
//     Kafka. Its checkpoint is the older of the two, so neither misses a
//     change; PostgreSQL's version guard absorbs replays, and the Kafka
//     sink, never ahead of PostgreSQL in this order, resumes from its own
//     checkpoint (exactly once with exactly_once: true).
//
// It opens the Kafka sink (connecting, creating the checkpoint topic,
// fencing an older instance with the same transactional id). The caller
// closes the returned sink, which closes both; on error it still owns pg.
func withKafka(ctx context.Context, pg tidemark.Sink, kc *KafkaConfig, source string, log *slog.Logger) (tidemark.Sink, error) {
	if kc == nil {
		if pg == nil {
			return nil, errors.New("config: target: configure postgres, kafka or both")
		}
		return pg, nil
	}
	ks, err := kafka.Open(ctx, kc.SinkConfig(source, log.With("component", "kafka")))
	if err != nil {
		return nil, err
	}
	if pg == nil {
		return ks, nil
	}
	f, err := tidemark.NewFanout(
		tidemark.FanoutTarget{Name: "postgres", Sink: pg},
		tidemark.FanoutTarget{Name: "kafka", Sink: ks},
	)
	if err != nil {
		ks.Close()
		return nil, err
	}
	return f, nil
}

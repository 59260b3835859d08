package main

import (
	"context"
	"errors"
	"log/slog"

	"tidemark"
	"tidemark/sink/kafka"
)

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

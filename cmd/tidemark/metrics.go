package main

import (
	"context"
	"fmt"
	"log/slog"

	"tidemark/metrics"
	"tidemark/sink/kafka"
)

// Metrics is the daemon's metrics (package metrics) with the command's
// glue: the metrics section of the config, the Kafka applier's partitions.
type Metrics struct {
	*metrics.Metrics
}

// NewMetrics returns the metrics in a new registry.
func NewMetrics() *Metrics { return &Metrics{metrics.New()} }

// Serve serves the metrics on cfg.Listen (default 127.0.0.1:9650; "off":
// none) until ctx is done, with the TLS and basic authentication of
// cfg.WebConfigFile.
func (m *Metrics) Serve(ctx context.Context, cfg MetricsConfig, log *slog.Logger) error {
	cfg = cfg.withDefaults()
	var web *metrics.WebConfig
	if cfg.WebConfigFile != "" && cfg.Listen != "off" {
		var err error
		if web, err = metrics.LoadWebConfig(cfg.WebConfigFile); err != nil {
			return fmt.Errorf("config: metrics.web_config_file: %w", err)
		}
	}
	return m.Metrics.Serve(ctx, cfg.Listen, web, log)
}

// WatchApplier exports the partitions assigned to an apply-group member
// (tidemark_apply_partition_*), read at scrape time.
func (m *Metrics) WatchApplier(status func() []kafka.PartitionStatus) {
	m.WatchPartitions(func() []metrics.Partition {
		ps := status()
		out := make([]metrics.Partition, len(ps))
		for i, p := range ps {
			out[i] = metrics.Partition{Topic: p.Topic, Partition: p.Partition, Lag: p.Lag(), Next: p.Next, Records: p.Records}
		}
		return out
	})
}

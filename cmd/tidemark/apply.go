package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"tidemark"
	"tidemark/sink/kafka"
)

// ApplyConfig is the apply section of the config file: the consumer group of
// `tidemark apply` (docs/SCALE-OUT.md).
//
//	apply:
//	  group: tidemark-apply-shop   # default tidemark-apply-<source.name>
//	  topics: '^shop\.'            # regular expression; default ^<topic_prefix>\.
//	  max_records: 5000            # records per batch (one PostgreSQL transaction)
//	  partition_change_wait: 60s   # the tailer's wait for the group after partitions were added
type ApplyConfig struct {
	Group      string `yaml:"group"`
	Topics     string `yaml:"topics"`
	MaxRecords int    `yaml:"max_records"`
	// PartitionChangeWait bounds how long the tailer waits, when a change
	// topic's partition count changed since it last published to it, for
	// the group to apply every record of the old partitions before it
	// stops (kafka.Config.PartitionChangeWait; default 60s).
	PartitionChangeWait time.Duration `yaml:"partition_change_wait"`
}

// applierConfig builds the applier's config from the file's sections.
func (c *Config) applierConfig(log *slog.Logger) kafka.ApplierConfig {
	k := c.Target.Kafka
	sc := k.SinkConfig(c.Source.Name, nil)
	prefix := sc.TopicPrefix
	if prefix == "" {
		prefix = kafka.DefaultTopicPrefix
	}
	cpTopic := sc.CheckpointTopic
	if cpTopic == "" {
		cpTopic = prefix + ".checkpoints"
	}
	ac := kafka.ApplierConfig{
		Brokers:    k.Brokers,
		Security:   k.security(),
		Group:      c.Apply.Group,
		Topics:     c.Apply.Topics,
		Exclude:    "^" + regexp.QuoteMeta(cpTopic) + "$",
		MaxRecords: c.Apply.MaxRecords,
		Logger:     log,
		// Control records are checked against the tailer's topics.
		Source:        c.Source.Name,
		TopicPrefix:   sc.TopicPrefix,
		TopicTemplate: sc.TopicTemplate,
	}
	if ac.Group == "" {
		ac.Group = "tidemark-apply-" + c.Source.Name
	}
	if ac.Topics == "" {
		ac.Topics = "^" + regexp.QuoteMeta(prefix) + `\.`
	}
	return ac
}

// applyCmd is `tidemark apply`: one member of the apply group, until
// SIGINT/SIGTERM.
type applyCmd struct {
	cmdBase
	metricsListen string
}

func (c *applyCmd) parseFlags(args []string) error {
	err := c.parseConfig(args, func(fs *flag.FlagSet) {
		fs.StringVar(&c.metricsListen, "metrics", "", `metrics address of this member, overriding metrics.listen ("off", or e.g. 127.0.0.1:9651 for a second member on one machine)`)
	})
	if err != nil {
		return err
	}
	cfg := c.cfg
	if c.metricsListen != "" {
		cfg.Metrics.Listen = c.metricsListen
		if err := cfg.Metrics.Validate(); err != nil {
			return fmt.Errorf("tidemark apply: --metrics: %w", err)
		}
	}
	if cfg.Apply == nil || cfg.Target.Postgres == nil || cfg.Target.Kafka == nil {
		return errors.New("tidemark apply: the config needs an apply section, target.postgres and target.kafka")
	}
	return nil
}

func (c *applyCmd) run(ctx context.Context) int {
	cfg, log := c.cfg, c.log
	ac := cfg.applierConfig(log)
	log.Info("starting", "group", ac.Group, "topics", ac.Topics, "version", buildVersion())
	var cl closers
	defer cl.close()
	state, err := openStateTarget(ctx, cfg, log, openDaemon, &cl)
	if err != nil {
		return startFailed(ctx, log, err)
	}
	sink, err := need[tidemark.StreamTarget](state, "tidemark apply")
	if err != nil {
		log.Error("start failed", "err", err)
		return exitUsage
	}
	m := NewMetrics()
	var applied atomic.Int64
	ac.OnApply = func(r kafka.ApplyReport) {
		m.OnApply(r.Batch, r.Stats, r.Took)
		applied.Add(int64(r.Records))
	}
	a, err := kafka.NewApplier(ac, sink)
	if err != nil {
		log.Error("start failed", "err", err)
		return exitUsage
	}
	m.WatchApplier(a.Status)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return m.Serve(gctx, cfg.Metrics, log.With("component", "metrics")) })
	g.Go(func() error { return logApplierStatus(gctx, a, &applied, log) })
	g.Go(func() error {
		if err := a.Run(gctx); err != nil {
			return err
		}
		return context.Canceled // a clean stop ends the helpers too
	})
	if err := g.Wait(); err != nil && !errors.Is(err, context.Canceled) {
		return c.fail("applier stopped", err)
	}
	log.Info("stopped cleanly", "changes", applied.Load())
	return exitOK
}

// logApplierStatus logs the member's assignment and lag every 10 s.
func logApplierStatus(ctx context.Context, a *kafka.Applier, applied *atomic.Int64, log *slog.Logger) error {
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	last, lastAt := int64(0), time.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			n := applied.Load()
			var parts, stopped []string
			var lag int64
			for _, p := range a.Status() {
				parts = append(parts, fmt.Sprintf("%s/%d", p.Topic, p.Partition))
				lag += max(p.Lag(), 0)
				if p.Stopped != "" {
					stopped = append(stopped, fmt.Sprintf("%s/%d@%d", p.Topic, p.Partition, p.Next))
				}
			}
			args := []any{"assigned", strings.Join(parts, ","), "lag_records", lag,
				"changes_per_s", int64(float64(n-last) / now.Sub(lastAt).Seconds()), "changes", n}
			if len(stopped) > 0 {
				args = append(args, "stopped", strings.Join(stopped, ","))
			}
			log.Info("apply status", args...)
			last, lastAt = n, now
		}
	}
}

package main

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"time"

	"golang.org/x/sync/errgroup"

	"tidemark"
	"tidemark/binlog"
	"tidemark/status"
	"tidemark/verify"
)

// runCmd is `tidemark run`: the daemon, until SIGINT/SIGTERM.
type runCmd struct {
	cmdBase
	cpuProfile, blockProfile, mutexProfile string
}

func (c *runCmd) parseFlags(args []string) error {
	return c.parseConfig(args, func(fs *flag.FlagSet) {
		fs.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of the run to this file")
		fs.StringVar(&c.blockProfile, "blockprofile", "", "write a goroutine blocking profile of the run to this file")
		fs.StringVar(&c.mutexProfile, "mutexprofile", "", "write a mutex contention profile of the run to this file")
	})
}

func (c *runCmd) run(ctx context.Context) int {
	cfg := c.cfg
	m := NewMetrics()
	// The status page (served with /metrics) reads the databases through
	// d and src, set below; it keeps the warnings and errors logged.
	var d *daemon
	var src *source
	page := status.NewPage(status.Identity{Name: cfg.Source.Name, Flavor: orDefault(cfg.Source.Flavor, binlog.FlavorMariaDB),
		Addr: cfg.Source.Addr, ServerID: cfg.Source.ServerID, Version: buildVersion()},
		pageSources(cfg, m, func() (*daemon, *binlog.Verifier) {
			if src == nil {
				return d, nil
			}
			return d, src.verifier
		}))
	log := slog.New(page.Tee(c.log.Handler()))
	// SIGINT and SIGTERM are already caught (run): from this line on they
	// stop the daemon cleanly.
	log.Info("starting", "source", cfg.Source.Name, "version", buildVersion())
	if c.cpuProfile != "" {
		stop, err := startCPUProfile(c.cpuProfile)
		if err != nil {
			log.Error("start CPU profile", "err", err)
			return exitUsage
		}
		defer stop()
	}
	for _, p := range []struct{ name, path string }{{"block", c.blockProfile}, {"mutex", c.mutexProfile}} {
		if p.path == "" {
			continue
		}
		stop, err := startProfile(p.name, p.path)
		if err != nil {
			log.Error("start "+p.name+" profile", "err", err)
			return exitUsage
		}
		defer stop()
	}
	var cl closers
	defer cl.close()
	var err error
	if d, err = assemble(ctx, cfg, log, c.stderr, applyLogger(log, m, page)); err != nil {
		return startFailed(ctx, log, err)
	}
	cl.push(d.Close)
	if src, err = openSource(cfg, log, useVerifier, &cl); err != nil {
		log.Error("start failed", "err", err)
		return exitFailed
	}
	return c.serve(ctx, d, src.verifier, m, page, log)
}

// applyLogger is the daemon's OnApply: the metrics, the status page, and
// a log line of the totals every 10 s.
func applyLogger(log *slog.Logger, m *Metrics, page *status.Page) func(*tidemark.Batch, tidemark.ApplyStats, time.Duration) {
	var applied tidemark.ApplyStats
	last := time.Now()
	return func(b *tidemark.Batch, s tidemark.ApplyStats, took time.Duration) {
		m.OnApply(b, s, took)
		page.OnApply(b, s, took)
		applied.Add(s)
		if time.Since(last) >= 10*time.Second {
			last = time.Now()
			log.Info("applied", "inserted", applied.Inserted, "updated", applied.Updated, "deleted", applied.Deleted,
				"skipped", applied.Skipped, "coalesced", applied.Coalesced, "checkpoint", b.Checkpoint.String())
		}
	}
}

// serve runs the assembled daemon with its helpers (metrics, status page,
// post-load assertion, retention watch) until the pipeline stops.
func (c *runCmd) serve(ctx context.Context, d *daemon, src *binlog.Verifier, m *Metrics, page *status.Page, log *slog.Logger) int {
	cfg := c.cfg
	if d.dedupe != nil {
		m.WatchDedupe(func(f func(string, uint64)) { d.dedupe.Stats().Each(f) })
	}
	if di, ok := d.state.sink.(directInserter); ok {
		m.WatchDirectInserts(di.DirectInserts)
	}
	d.onTableState = m.WatchTableStates()
	d.onCatchUp = page.SetCatchUp
	m.SetStatusPage(page)
	g, gctx := errgroup.WithContext(ctx)
	if d.state.sink != nil {
		// The post-load duplicate assertion runs on the state target.
		at, err := need[tidemark.AssertTarget](d.state, "the post-load duplicate assertion")
		if err != nil {
			log.Error("start failed", "err", err)
			return exitFailed
		}
		as := verify.NewAsserter(at, cfg.Verify.assert(), log.With("component", "assert"), m.Error)
		d.afterCatchUp = func(ctx context.Context, since time.Time, rows map[string]int64) error {
			m.FallbackRun(rows)
			return as.AfterLoad(ctx, since)
		}
		g.Go(func() error { return as.Run(gctx) })
	}
	g.Go(func() error { return m.Serve(gctx, cfg.Metrics, log.With("component", "metrics")) })
	if d.state.sink != nil && cfg.Metrics.Listen != "off" {
		g.Go(func() error { return page.WatchVerify(gctx, time.Minute) })
	}
	g.Go(func() error {
		return m.WatchRetention(gctx, cfg.Metrics.RetentionInterval, retentionProbe(src, d.target, cfg.Source.Name), log)
	})
	g.Go(func() error {
		err := d.pipeline.Run(gctx, d.start)
		m.Error(err)
		if err == nil {
			// A clean stop ends the helpers too.
			return context.Canceled
		}
		return err
	})
	if err := g.Wait(); err != nil && !errors.Is(err, context.Canceled) {
		if errors.Is(err, tidemark.ErrPositionPurged) {
			log.Error("the source has purged the checkpoint's binlog position and the fallback is off; run `tidemark catchup` or enable fallback", "err", err)
		} else {
			log.Error("pipeline stopped", "err", err)
		}
		return exitFailed
	}
	total, pos := d.pipeline.Totals()
	log.Info("stopped cleanly", "checkpoint", pos.String(), "inserted", total.Inserted, "updated", total.Updated,
		"deleted", total.Deleted, "skipped", total.Skipped, "coalesced", total.Coalesced)
	return exitOK
}

package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"text/tabwriter"

	"tidemark"
	"tidemark/sink/kafka"
)

// doctorCmd is `tidemark doctor`: it prints every prerequisite of the
// source and the target as ok, warn or fix (with the fix) and exits 0 when
// none needs a fix, 1 otherwise. It changes nothing on either side, and
// logs only errors.
type doctorCmd struct {
	cmdBase
}

func (c *doctorCmd) parseFlags(args []string) error {
	if err := c.parseConfig(args, nil); err != nil {
		return err
	}
	c.setLogger(LogConfig{Level: "error"})
	return nil
}

func (c *doctorCmd) run(ctx context.Context) int {
	checks, err := doctorChecks(ctx, c.cfg, c.log)
	if err != nil {
		fmt.Fprintln(c.stderr, "tidemark:", err)
		return exitUsage
	}
	printChecks(c.stdout, checks)
	for _, ch := range checks {
		if ch.Status == tidemark.CheckFix {
			return exitFailed
		}
	}
	return exitOK
}

// doctorChecks runs the source's checks (binlog.Tailer.Doctor, which
// shares checkServer's) and the PostgreSQL target's; the stored checkpoint,
// when the target has one, is compared with the source's identity.
func doctorChecks(ctx context.Context, cfg *Config, log *slog.Logger) ([]tidemark.Check, error) {
	var cl closers
	defer cl.close()
	src, err := openSource(cfg, log, useTailer, &cl)
	if err != nil {
		return nil, err
	}
	var target []tidemark.Check
	var stored *tidemark.Position
	if cfg.Target.Postgres != nil {
		state, err := openStateTarget(ctx, cfg, log, openReadOnly, &cl)
		if err != nil {
			target = []tidemark.Check{{Name: "target connection", Status: tidemark.CheckFix, Found: err.Error(), Fix: "check target.postgres.dsn"}}
		} else {
			dr, err := need[targetDoctor](state, "tidemark doctor")
			if err != nil {
				return nil, err
			}
			target = dr.Doctor(ctx)
			if target[0].Status == tidemark.CheckOK {
				// No control table yet reads as an error: no checkpoint.
				if pos, ok, err := state.sink.Checkpoint(ctx, cfg.Source.Name); err == nil && ok {
					stored = &pos
				}
			}
		}
	}
	if k := cfg.Target.Kafka; k != nil {
		target = append(target, kafka.Doctor(ctx, k.SinkConfig(cfg.Source.Name, log)))
	}
	return append(src.tailer.Doctor(ctx, stored, cfg.lagBudget()), target...), nil
}

func printChecks(w io.Writer, checks []tidemark.Check) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STATUS\tCHECK\tFOUND")
	for _, c := range checks {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", c.Status, c.Name, c.Found)
	}
	tw.Flush()
	first := true
	for _, c := range checks {
		if c.Status == tidemark.CheckOK || c.Fix == "" {
			continue
		}
		if first {
			fmt.Fprintln(w, "\nto do:")
			first = false
		}
		fmt.Fprintf(w, "  %s %s: %s\n", c.Status, c.Name, c.Fix)
	}
}

// targetDoctor checks a target's prerequisites (connection, privileges,
// control tables in the control schema).
type targetDoctor interface {
	Doctor(ctx context.Context) []tidemark.Check
}

package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"tidemark"
	"tidemark/binlog"
	"tidemark/metrics"
	"tidemark/sink/kafka"
	"tidemark/status"
)

// applyStatus reads the apply group's partitions from Kafka and their
// offsets from PostgreSQL.
func applyStatus(ctx context.Context, sink offsetReader, cfg *Config) (*status.Apply, error) {
	ac := cfg.applierConfig(nil)
	parts, err := kafka.GroupStatus(ctx, ac)
	if err != nil {
		return nil, err
	}
	st := &status.Apply{Group: ac.Group, Partitions: []status.ApplyPartition{}}
	next := map[string]map[int32]int64{}
	for _, p := range parts {
		if _, ok := next[p.Topic]; !ok {
			offs, err := sink.Offsets(ctx, ac.Group, p.Topic)
			if err != nil {
				return nil, err
			}
			next[p.Topic] = map[int32]int64{}
			for _, o := range offs {
				next[p.Topic][o.Partition] = o.Next
			}
		}
		n := next[p.Topic][p.Partition]
		st.Partitions = append(st.Partitions, status.ApplyPartition{Topic: p.Topic, Partition: p.Partition, Next: n, End: p.End, Lag: max(p.End-n, 0), Member: p.Member})
	}
	return st, nil
}

// offsetReader reads the stream offsets the appliers stored in the target
// (tidemark.StreamTarget's Offsets).
type offsetReader interface {
	Offsets(ctx context.Context, group, topic string) ([]tidemark.StreamOffset, error)
}

// statusCmd is `tidemark status [--json]`: the checkpoint, the binlog
// retention headroom, and per table the watermark, mode and lag.
type statusCmd struct {
	cmdBase
	asJSON bool
}

func (c *statusCmd) parseFlags(args []string) error {
	err := c.parseConfig(args, func(fs *flag.FlagSet) {
		fs.BoolVar(&c.asJSON, "json", false, "print the status as JSON")
	})
	if err != nil {
		return err
	}
	return c.cfg.needPostgres("status")
}

func (c *statusCmd) run(ctx context.Context) int {
	var cl closers
	defer cl.close()
	src, state, exit, ok := c.openSourceAndState(ctx, useVerifier, openCommand, &cl)
	if !ok {
		return exit
	}
	rep, err := fullStatus(ctx, src.verifier, state, c.cfg)
	if err != nil {
		return c.fail("status failed", err)
	}
	if c.asJSON {
		enc := json.NewEncoder(c.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return exitFailed
		}
		return exitOK
	}
	printStatus(c.stdout, rep)
	return exitOK
}

// fullStatus is the status of cfg's source: checkpoint, retention, tables
// with their recorded modes (and the apply group's offsets in the
// scale-out topology), read from the state target.
func fullStatus(ctx context.Context, src status.Source, state stateTarget, cfg *Config) (*status.Report, error) {
	dst, err := need[status.Target](state, "tidemark status")
	if err != nil {
		return nil, err
	}
	reg, err := need[tidemark.TableRegistry](state, "tidemark status")
	if err != nil {
		return nil, err
	}
	var schemas []string
	if s := cfg.Target.Postgres.Schema; s != "" {
		schemas = []string{s}
	}
	rep, err := status.Build(ctx, src, dst, cfg.Source.Name, schemas)
	if err != nil {
		return nil, err
	}
	states, err := reg.TableStates(ctx, cfg.Source.Name)
	if err != nil {
		return nil, err
	}
	status.ApplyTableStates(rep, states, cfg.Target.Postgres.Schema)
	if cfg.Apply != nil && cfg.Target.Kafka != nil {
		offs, err := need[offsetReader](state, "the apply group's status")
		if err != nil {
			return nil, err
		}
		if rep.Apply, err = applyStatus(ctx, offs, cfg); err != nil {
			return nil, err
		}
	}
	return rep, nil
}

// verifyRunReader reads the last recorded `tidemark verify` run.
type verifyRunReader interface {
	LastVerifyRun(ctx context.Context, source string) (tidemark.VerifyRun, bool, error)
}

// pageSources is what the daemon's status page reads: the status and the
// last verify run through the daemon and source verifier current returns
// (nil until they are wired), and the metrics' dedupe counters; the verify
// runs it reads go to the metrics.
func pageSources(cfg *Config, m *Metrics, current func() (*daemon, *binlog.Verifier)) status.Sources {
	return status.Sources{
		Report: func(ctx context.Context) (*status.Report, error) {
			d, src := current()
			if d == nil || d.state.sink == nil || src == nil {
				return nil, errors.New("no PostgreSQL target to read the status from (yet)")
			}
			return fullStatus(ctx, src, d.state, cfg)
		},
		LastVerify: func(ctx context.Context) (tidemark.VerifyRun, bool, error) {
			d, _ := current()
			if d == nil {
				return tidemark.VerifyRun{}, false, nil
			}
			return lastVerifyRun(ctx, d.state, cfg.Source.Name)
		},
		Dedupe:   m.EachDedupe,
		OnVerify: m.SetVerify,
	}
}

// lastVerifyRun is the status page's last verify run of source: none when
// the state target records no runs.
func lastVerifyRun(ctx context.Context, state stateTarget, source string) (tidemark.VerifyRun, bool, error) {
	r, ok := state.sink.(verifyRunReader)
	if !ok {
		return tidemark.VerifyRun{}, false, nil
	}
	return r.LastVerifyRun(ctx, source)
}

func fmtTime(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.Format(time.RFC3339)
}

// printStatus writes the readable status.
func printStatus(w io.Writer, rep *status.Report) {
	fmt.Fprintf(w, "source %s\n", rep.Source)
	cp := rep.Checkpoint
	if cp == "" {
		cp = "(none)"
	}
	fmt.Fprintf(w, "  checkpoint   %s\n", cp)
	if r := rep.Retention; r != nil {
		expire := "never (0)"
		if r.ExpireSeconds > 0 {
			expire = status.FormatHours(time.Duration(r.ExpireSeconds) * time.Second)
		}
		fmt.Fprintf(w, "  binlog       checkpoint in %s; %d files on the server, oldest %s; expiry %s\n", r.File, r.Files, r.Oldest, expire)
		fmt.Fprintf(w, "  retention    %s", r.Headroom)
		if r.PurgeAfter != nil {
			fmt.Fprintf(w, " (file closed %s, purgeable after %s)", fmtTime(r.ClosedAt), fmtTime(r.PurgeAfter))
		}
		fmt.Fprintln(w)
	} else {
		fmt.Fprintf(w, "  retention    unknown: %s\n", rep.RetentionError)
	}
	fmt.Fprintf(w, "  clock skew   source − target = %.1fs\n\n", rep.ClockSkewSeconds)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TABLE\tMODE\tWATERMARK\tROWS (EST.)\tLAST SOURCE COMMIT\tLAG")
	for _, t := range rep.Tables {
		lag := "-"
		if t.LagSeconds != nil {
			lag = (time.Duration(*t.LagSeconds * float64(time.Second))).Round(time.Millisecond).String()
		}
		rows := "?"
		if t.Rows >= 0 {
			rows = fmt.Sprint(t.Rows)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", t.Table, t.Mode, fmtTime(t.Watermark), rows, fmtTime(t.LastCommit), lag)
	}
	tw.Flush()
	for _, t := range rep.Tables {
		if t.Reason != "" {
			fmt.Fprintf(w, "  %s is %s: %s\n", t.Table, t.Mode, t.Reason)
		}
	}
	if a := rep.Apply; a != nil {
		fmt.Fprintf(w, "\napply group %s\n", a.Group)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "TOPIC\tPARTITION\tNEXT (POSTGRESQL)\tEND (KAFKA)\tLAG\tMEMBER")
		for _, p := range a.Partitions {
			m := p.Member
			if m == "" {
				m = "(unassigned)"
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\n", p.Topic, p.Partition, p.Next, p.End, p.Lag, m)
		}
		tw.Flush()
	}
	if rep.Note != "" {
		fmt.Fprintf(w, "\nnote: %s\n", rep.Note)
	}
}

// retentionProbe returns what Metrics.WatchRetention calls in the daemon:
// the stored checkpoint of source and the retention of its binlog file.
func retentionProbe(src *binlog.Verifier, sink interface {
	Checkpoint(ctx context.Context, source string) (tidemark.Position, bool, error)
}, source string) func(context.Context) (tidemark.Retention, error) {
	return func(ctx context.Context) (tidemark.Retention, error) {
		pos, ok, err := sink.Checkpoint(ctx, source)
		if err != nil {
			return tidemark.Retention{}, err
		}
		if !ok {
			return tidemark.Retention{}, fmt.Errorf("binlog retention of %s: %w", source, metrics.ErrNoCheckpointYet)
		}
		return src.Retention(ctx, pos, time.Now())
	}
}

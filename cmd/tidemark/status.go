package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"tidemark"
	"tidemark/binlog"
	"tidemark/sink/kafka"
)

// Table modes. There is no per-table state store yet: every table found in
// the target is reported as streaming.
const modeStreaming = "streaming"

// StatusTable is one table of `tidemark status`.
type StatusTable struct {
	Table      string     `json:"table"`
	Mode       string     `json:"mode"`
	Watermark  *time.Time `json:"watermark,omitempty"`
	Rows       int64      `json:"rows_estimate"` // -1: unknown (table never analyzed)
	LastCommit *time.Time `json:"last_source_commit,omitempty"`
	LastLoaded *time.Time `json:"last_target_commit,omitempty"`
	LagSeconds *float64   `json:"lag_seconds,omitempty"`
	// Reason says why a table is not streaming (quarantined, resync,
	// snapshotting).
	Reason string `json:"reason,omitempty"`
}

// StatusRetention is the binlog retention of the checkpoint's file.
type StatusRetention struct {
	File            string     `json:"file"`
	Files           int        `json:"files"`
	Oldest          string     `json:"oldest"`
	ExpireSeconds   int64      `json:"expire_seconds"`
	Open            bool       `json:"open"`
	Purged          bool       `json:"purged"`
	Unbounded       bool       `json:"unbounded"`
	ClosedAt        *time.Time `json:"closed_at,omitempty"`
	PurgeAfter      *time.Time `json:"purge_after,omitempty"`
	HeadroomSeconds *float64   `json:"headroom_seconds,omitempty"`
	Headroom        string     `json:"headroom"`
}

// StatusReport is the output of `tidemark status`.
type StatusReport struct {
	Source     string           `json:"source"`
	Checkpoint string           `json:"checkpoint"`
	Retention  *StatusRetention `json:"retention,omitempty"`
	// RetentionError says why the retention could not be read.
	RetentionError string `json:"retention_error,omitempty"`
	// ClockSkewSeconds is the source's clock minus the target's, measured
	// now; lags mix the two clocks.
	ClockSkewSeconds float64       `json:"clock_skew_seconds"`
	Tables           []StatusTable `json:"tables"`
	Note             string        `json:"note"`
	// Apply is the apply group's view (config with an apply section).
	Apply *StatusApply `json:"apply,omitempty"`
}

// StatusApply is the apply group of the scale-out topology: per partition
// of its topics, the offset committed in PostgreSQL, the topic's end and
// the member it is assigned to.
type StatusApply struct {
	Group      string                 `json:"group"`
	Partitions []StatusApplyPartition `json:"partitions"`
}

// StatusApplyPartition is one partition of StatusApply. Lag is End − Next:
// records not applied yet, counting transaction markers (a caught-up
// partition of a transactional topic shows 0 or 1).
type StatusApplyPartition struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Next      int64  `json:"next"`
	End       int64  `json:"end"`
	Lag       int64  `json:"lag"`
	Member    string `json:"member"`
}

// applyStatus reads the apply group's partitions from Kafka and their
// offsets from PostgreSQL.
func applyStatus(ctx context.Context, sink offsetReader, cfg *Config) (*StatusApply, error) {
	ac := cfg.applierConfig(nil)
	parts, err := kafka.GroupStatus(ctx, ac)
	if err != nil {
		return nil, err
	}
	st := &StatusApply{Group: ac.Group, Partitions: []StatusApplyPartition{}}
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
		st.Partitions = append(st.Partitions, StatusApplyPartition{Topic: p.Topic, Partition: p.Partition, Next: n, End: p.End, Lag: max(p.End-n, 0), Member: p.Member})
	}
	return st, nil
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

func statusRetention(r tidemark.Retention) *StatusRetention {
	sr := &StatusRetention{File: r.File, Files: r.Files, Oldest: r.Oldest, ExpireSeconds: int64(r.Expire / time.Second),
		Open: r.Open, Purged: r.Purged, Unbounded: r.Unbounded, ClosedAt: timePtr(r.ClosedAt), PurgeAfter: timePtr(r.PurgeAfter),
		Headroom: formatHeadroom(r)}
	if !r.Unbounded && !r.Purged {
		h := r.Headroom.Seconds()
		sr.HeadroomSeconds = &h
	}
	return sr
}

// offsetReader reads the stream offsets the appliers stored in the target
// (tidemark.StreamTarget's Offsets).
type offsetReader interface {
	Offsets(ctx context.Context, group, topic string) ([]tidemark.StreamOffset, error)
}

// sourceStatus is what status reads from the source.
type sourceStatus interface {
	Retention(ctx context.Context, pos tidemark.Position, now time.Time) (tidemark.Retention, error)
	Now(ctx context.Context) (time.Time, error)
}

// targetStatus is what status reads from the target.
type targetStatus interface {
	Checkpoint(ctx context.Context, source string) (tidemark.Position, bool, error)
	TableStatuses(ctx context.Context, source, controlSchema string, schemas []string) ([]tidemark.TableStatus, error)
	Now(ctx context.Context) (time.Time, error)
}

// buildStatus reads the checkpoint, retention, clocks and tables.
func buildStatus(ctx context.Context, src sourceStatus, dst targetStatus, source, controlSchema string, schemas []string) (*StatusReport, error) {
	rep := &StatusReport{Source: source}
	pos, ok, err := dst.Checkpoint(ctx, source)
	if err != nil {
		return nil, err
	}
	if ok {
		rep.Checkpoint = pos.String()
		r, err := src.Retention(ctx, pos, time.Now())
		if err != nil {
			rep.RetentionError = err.Error()
		} else {
			rep.Retention = statusRetention(r)
		}
	} else {
		rep.RetentionError = "no checkpoint stored for source " + source
	}
	if sn, err := src.Now(ctx); err == nil {
		if tn, err := dst.Now(ctx); err == nil {
			rep.ClockSkewSeconds = sn.Sub(tn).Seconds()
		}
	}
	tables, err := dst.TableStatuses(ctx, source, controlSchema, schemas)
	if err != nil {
		return nil, err
	}
	for _, t := range tables {
		st := StatusTable{Table: t.Schema + "." + t.Name, Mode: modeStreaming, Watermark: timePtr(t.Watermark), Rows: t.Rows,
			LastCommit: timePtr(t.LastCommit), LastLoaded: timePtr(t.LastLoaded)}
		if !t.LastCommit.IsZero() {
			l := t.Lag.Seconds()
			st.LagSeconds = &l
		}
		rep.Tables = append(rep.Tables, st)
	}
	return rep, nil
}

// cmdStatus implements `tidemark status [--json]`: the checkpoint, the
// binlog retention headroom, and per table the watermark, mode and lag.
func cmdStatus(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var asJSON bool
	cfg, log, bc, exit, ok := loadStateCommand("status", args, stderr, func(fs *flagSet) {
		fs.BoolVar(&asJSON, "json", false, "print the status as JSON")
	})
	if !ok {
		return exit
	}
	src, err := binlog.NewVerifier(bc)
	if err != nil {
		fmt.Fprintln(stderr, "tidemark:", err)
		return exitUsage
	}
	defer src.Close()
	state, err := openStateTarget(ctx, cfg, log, openCommand)
	if err != nil {
		log.Error("status failed", "err", err)
		return exitFailed
	}
	defer state.Close()
	rep, err := fullStatus(ctx, src, state, cfg)
	if err != nil {
		log.Error("status failed", "err", err)
		return exitFailed
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return exitFailed
		}
		return exitOK
	}
	printStatus(stdout, rep)
	return exitOK
}

// fullStatus is the status of cfg's source: checkpoint, retention, tables
// with their recorded modes (and the apply group's offsets in the
// scale-out topology), read from the state target.
func fullStatus(ctx context.Context, src sourceStatus, state stateTarget, cfg *Config) (*StatusReport, error) {
	dst, err := need[targetStatus](state, "tidemark status")
	if err != nil {
		return nil, err
	}
	reg, err := need[tidemark.TableRegistry](state, "tidemark status")
	if err != nil {
		return nil, err
	}
	controlSchema := cfg.controlSchema()
	var schemas []string
	if s := cfg.Target.Postgres.Schema; s != "" {
		schemas = []string{s}
	}
	rep, err := buildStatus(ctx, src, dst, cfg.Source.Name, controlSchema, schemas)
	if err != nil {
		return nil, err
	}
	states, err := reg.TableStates(ctx, cfg.Source.Name)
	if err != nil {
		return nil, err
	}
	applyTableStates(rep, states, cfg.Target.Postgres.Schema)
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
func printStatus(w io.Writer, rep *StatusReport) {
	fmt.Fprintf(w, "source %s\n", rep.Source)
	cp := rep.Checkpoint
	if cp == "" {
		cp = "(none)"
	}
	fmt.Fprintf(w, "  checkpoint   %s\n", cp)
	if r := rep.Retention; r != nil {
		expire := "never (0)"
		if r.ExpireSeconds > 0 {
			expire = fmtHours(time.Duration(r.ExpireSeconds) * time.Second)
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

// errNoCheckpointYet: there is no position to measure the retention of yet
// (a first start, before the first commit). Not a failure.
var errNoCheckpointYet = errors.New("no checkpoint yet")

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
			return tidemark.Retention{}, fmt.Errorf("binlog retention of %s: %w", source, errNoCheckpointYet)
		}
		return src.Retention(ctx, pos, time.Now())
	}
}

// applyTableStates sets the mode (and reason) of the tables the daemon
// recorded as not streaming, mapping each source table to its target
// (targetSchema, or the source database's name). A table with a state but
// no target table (never loaded, e.g. quarantined on first sight) is
// listed too.
func applyTableStates(rep *StatusReport, states []tidemark.TableState, targetSchema string) {
	for _, st := range states {
		schema := targetSchema
		if schema == "" {
			schema = st.Table.Database
		}
		name := schema + "." + st.Table.Name
		found := false
		for i := range rep.Tables {
			if rep.Tables[i].Table == name {
				rep.Tables[i].Mode, rep.Tables[i].Reason = string(st.Mode), st.Reason
				found = true
			}
		}
		if !found {
			rep.Tables = append(rep.Tables, StatusTable{Table: name, Mode: string(st.Mode), Reason: st.Reason, Rows: -1})
		}
	}
}

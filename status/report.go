// Package status is the status of a source's replication: the report of
// `tidemark status` (checkpoint, binlog retention headroom, clock skew, per
// table its mode, watermark and lag, the apply group's offsets) and the
// status page the daemon serves beside /metrics. It reads the databases
// through the small interfaces Source and Target, and imports only the
// root package.
package status

import (
	"context"
	"strconv"
	"time"

	"tidemark"
)

// ModeStreaming is the mode of a table without a recorded state
// (ApplyTableStates sets the others).
const ModeStreaming = "streaming"

// Table is one table of `tidemark status`.
type Table struct {
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

// Retention is the binlog retention of the checkpoint's file.
type Retention struct {
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

// Report is the output of `tidemark status`.
type Report struct {
	Source     string     `json:"source"`
	Checkpoint string     `json:"checkpoint"`
	Retention  *Retention `json:"retention,omitempty"`
	// RetentionError says why the retention could not be read.
	RetentionError string `json:"retention_error,omitempty"`
	// ClockSkewSeconds is the source's clock minus the target's, measured
	// now; lags mix the two clocks.
	ClockSkewSeconds float64 `json:"clock_skew_seconds"`
	Tables           []Table `json:"tables"`
	Note             string  `json:"note"`
	// Apply is the apply group's view (config with an apply section).
	Apply *Apply `json:"apply,omitempty"`
}

// Apply is the apply group of the scale-out topology: per partition
// of its topics, the offset committed in PostgreSQL, the topic's end and
// the member it is assigned to.
type Apply struct {
	Group      string           `json:"group"`
	Partitions []ApplyPartition `json:"partitions"`
}

// ApplyPartition is one partition of Apply. Lag is End − Next:
// records not applied yet, counting transaction markers (a caught-up
// partition of a transactional topic shows 0 or 1).
type ApplyPartition struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Next      int64  `json:"next"`
	End       int64  `json:"end"`
	Lag       int64  `json:"lag"`
	Member    string `json:"member"`
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

func retentionOf(r tidemark.Retention) *Retention {
	sr := &Retention{File: r.File, Files: r.Files, Oldest: r.Oldest, ExpireSeconds: int64(r.Expire / time.Second),
		Open: r.Open, Purged: r.Purged, Unbounded: r.Unbounded, ClosedAt: timePtr(r.ClosedAt), PurgeAfter: timePtr(r.PurgeAfter),
		Headroom: FormatHeadroom(r)}
	if !r.Unbounded && !r.Purged {
		h := r.Headroom.Seconds()
		sr.HeadroomSeconds = &h
	}
	return sr
}

// Source is what status reads from the source.
type Source interface {
	Retention(ctx context.Context, pos tidemark.Position, now time.Time) (tidemark.Retention, error)
	Now(ctx context.Context) (time.Time, error)
}

// Target is what status reads from the target.
type Target interface {
	Checkpoint(ctx context.Context, source string) (tidemark.Position, bool, error)
	TableStatuses(ctx context.Context, source string, schemas []string) ([]tidemark.TableStatus, error)
	Now(ctx context.Context) (time.Time, error)
}

// Build reads the checkpoint, retention, clocks and tables.
func Build(ctx context.Context, src Source, dst Target, source string, schemas []string) (*Report, error) {
	rep := &Report{Source: source}
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
			rep.Retention = retentionOf(r)
		}
	} else {
		rep.RetentionError = "no checkpoint stored for source " + source
	}
	if sn, err := src.Now(ctx); err == nil {
		if tn, err := dst.Now(ctx); err == nil {
			rep.ClockSkewSeconds = sn.Sub(tn).Seconds()
		}
	}
	tables, err := dst.TableStatuses(ctx, source, schemas)
	if err != nil {
		return nil, err
	}
	for _, t := range tables {
		st := Table{Table: t.Schema + "." + t.Name, Mode: ModeStreaming, Watermark: timePtr(t.Watermark), Rows: t.Rows,
			LastCommit: timePtr(t.LastCommit), LastLoaded: timePtr(t.LastLoaded)}
		if !t.LastCommit.IsZero() {
			l := t.Lag.Seconds()
			st.LagSeconds = &l
		}
		rep.Tables = append(rep.Tables, st)
	}
	return rep, nil
}

// ApplyTableStates sets the mode (and reason) of the tables the daemon
// recorded as not streaming, mapping each source table to its target
// (targetSchema, or the source database's name). A table with a state but
// no target table (never loaded, e.g. quarantined on first sight) is
// listed too.
func ApplyTableStates(rep *Report, states []tidemark.TableState, targetSchema string) {
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
			rep.Tables = append(rep.Tables, Table{Table: name, Mode: string(st.Mode), Reason: st.Reason, Rows: -1})
		}
	}
}

// FormatHeadroom formats a retention headroom for people.
func FormatHeadroom(r tidemark.Retention) string {
	switch {
	case r.Purged:
		return "PURGED"
	case r.Unbounded:
		return "unbounded (binlog_expire_logs_seconds = 0)"
	case r.Open:
		return "≥ " + FormatHours(r.Headroom) + " (file still being written)"
	case r.Headroom <= 0:
		return "0h: purgeable at the next rotation"
	}
	return FormatHours(r.Headroom)
}

// FormatHours formats a duration in hours, one decimal: "1.5h".
func FormatHours(d time.Duration) string {
	return strconv.FormatFloat(d.Hours(), 'f', 1, 64) + "h"
}

// Package verify compares a source with its target table by table and
// reports what differs: rows missing or extra in the target, rows whose
// values changed, business keys the target holds more than once, and UTC
// days whose counts or sums differ. It also runs the post-load assertion
// (Asserter).
//
// The package owns the comparison only. Each side computes counts,
// checksums and row digests inside its own database, behind the root
// interfaces tidemark.SourceVerifier (binlog.Verifier, MariaDB/MySQL) and
// tidemark.TargetVerifier (postgres.Verifier); the canonical forms both
// sides agree on are described in the root package (verify.go) and in
// docs/verify.md. verify imports only the root package and the standard
// library: cmd/ opens the two sides and prints the report.
package verify

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"tidemark"
)

// Defaults of Config.
const (
	// DefaultChunkRows is the source rows per checksum chunk.
	DefaultChunkRows = 10000
	// DefaultExamples is the keys listed per kind of difference.
	DefaultExamples = 10
)

// Config configures a verification. The zero value is valid: every field
// has a default.
type Config struct {
	// ChunkRows is the number of source rows per checksum chunk (default
	// DefaultChunkRows).
	ChunkRows int
	// Examples is how many missing, extra, changed and duplicate keys are
	// listed per table (default DefaultExamples).
	Examples int
	// Tables configures the daily reconciliation per "db.table"; a table
	// not listed is compared row by row only.
	Tables map[string]TableConfig
}

// TableConfig is the daily reconciliation of one table.
type TableConfig struct {
	// EventTime is the DATETIME or TIMESTAMP column that Options.Since
	// filters on and the daily totals group by (per UTC day).
	EventTime string
	// Sums lists the integer or DECIMAL columns whose SUM is compared per
	// day (COUNT(*) always is).
	Sums []string
}

func (c Config) withDefaults() Config {
	if c.ChunkRows <= 0 {
		c.ChunkRows = DefaultChunkRows
	}
	if c.Examples <= 0 {
		c.Examples = DefaultExamples
	}
	return c
}

// Progress is told about the work done on one table.
type Progress interface {
	// Add counts rows of the source checked.
	Add(rows int64)
	// Finish ends the table.
	Finish()
}

// Options is one verification run over several tables.
type Options struct {
	// Source names the source in the report.
	Source string
	// TargetSchema is the target schema of every table ("": the table's
	// source database).
	TargetSchema string
	// Config is the chunking, the examples and the daily reconciliation.
	Config Config
	// Tables are the tables to verify; empty: every table the source
	// replicates (SourceVerifier.Tables).
	Tables []tidemark.TableID
	// Since, when positive, compares only the rows whose event-time column
	// (TableConfig.EventTime) is within Since of now; tables without one
	// are compared whole.
	Since time.Duration
	// Zone returns the IANA zone the source writes a DATETIME column in;
	// nil: every DATETIME is UTC.
	Zone func(table tidemark.TableID, column string) string
	// Progress, if set, returns the progress of one table.
	Progress func(table tidemark.TableID) Progress
	// Logger receives a debug line per table (nil: none).
	Logger *slog.Logger
}

// Verdicts of a table and of a report.
const (
	VerdictEqual     = "equal"
	VerdictDifferent = "different"
	VerdictError     = "error"
)

// Exit codes of `tidemark verify` for a report (Report.ExitCode).
const (
	ExitEqual     = 0
	ExitDifferent = 1
	ExitError     = 2
)

// ColumnDiff is one column of a changed row.
type ColumnDiff struct {
	Column string  `json:"column"`
	Source *string `json:"source"`
	Target *string `json:"target"`
}

// ChangedRow is a key present on both sides with different values.
type ChangedRow struct {
	Key     []string     `json:"key"`
	Columns []ColumnDiff `json:"columns,omitempty"`
}

// DayDiff is one UTC day whose totals differ.
type DayDiff struct {
	Day          string   `json:"day"`
	SourceCount  int64    `json:"source_count"`
	TargetCount  int64    `json:"target_count"`
	SourceSums   []string `json:"source_sums,omitempty"`
	TargetSums   []string `json:"target_sums,omitempty"`
	DifferingSum []string `json:"differing_sums,omitempty"`
}

// TableReport is the verification of one table.
type TableReport struct {
	Table           string                  `json:"table"`
	Target          string                  `json:"target"`
	Verdict         string                  `json:"verdict"`
	Error           string                  `json:"error,omitempty"`
	SourceRows      int64                   `json:"source_rows"`
	TargetRows      int64                   `json:"target_rows"`
	Chunks          int                     `json:"chunks"`
	ChunksDiffering int                     `json:"chunks_differing"`
	Missing         int                     `json:"missing"`
	Extra           int                     `json:"extra"`
	Changed         int                     `json:"changed"`
	MissingKeys     [][]string              `json:"missing_keys,omitempty"`
	ExtraKeys       [][]string              `json:"extra_keys,omitempty"`
	ChangedRows     []ChangedRow            `json:"changed_rows,omitempty"`
	DuplicateKeys   int64                   `json:"duplicate_keys"`
	Duplicates      []tidemark.DuplicateKey `json:"duplicates,omitempty"`
	Sums            []string                `json:"sums,omitempty"`
	Days            int                     `json:"days,omitempty"`
	DaysDiffering   []DayDiff               `json:"days_differing,omitempty"`
	Since           *time.Time              `json:"since,omitempty"`
	Seconds         float64                 `json:"seconds"`
}

// Report is the verification of several tables (the output of `tidemark
// verify`).
type Report struct {
	Source  string        `json:"source"`
	Verdict string        `json:"verdict"`
	Tables  []TableReport `json:"tables"`
}

// ExitCode returns ExitEqual when every table is equal, ExitError when any
// table could not be verified, else ExitDifferent.
func (r *Report) ExitCode() int {
	code := ExitEqual
	for _, t := range r.Tables {
		switch t.Verdict {
		case VerdictError:
			return ExitError
		case VerdictDifferent:
			code = ExitDifferent
		}
	}
	return code
}

// Run summarizes the report for the target's control tables.
func (r *Report) Run() tidemark.VerifyRun {
	run := tidemark.VerifyRun{Source: r.Source, Verdict: r.Verdict, Tables: len(r.Tables)}
	var parts []string
	for _, t := range r.Tables {
		switch t.Verdict {
		case VerdictDifferent:
			run.Differing++
			parts = append(parts, fmt.Sprintf("%s: %d missing, %d extra, %d changed", t.Table, t.Missing, t.Extra, t.Changed))
		case VerdictError:
			run.Errors++
			parts = append(parts, t.Table+": not verified")
		}
	}
	run.Summary = strings.Join(parts, "; ")
	return run
}

// Tables verifies the tables of opt, one after the other. A table that
// cannot be verified is reported with verdict "error" and the others go
// on; the error is for listing the source's tables.
func Tables(ctx context.Context, src tidemark.SourceVerifier, dst tidemark.TargetVerifier, opt Options) (*Report, error) {
	cfg := opt.Config.withDefaults()
	log := opt.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ids := opt.Tables
	if len(ids) == 0 {
		var err error
		if ids, err = src.Tables(ctx); err != nil {
			return nil, fmt.Errorf("list source tables: %w", err)
		}
	}
	now := time.Now().UTC()
	var from time.Time
	if opt.Since > 0 {
		from = now.Add(-opt.Since)
	}
	rep := &Report{Source: opt.Source, Verdict: VerdictEqual}
	for _, id := range ids {
		t, err := src.Table(ctx, id)
		if err != nil {
			rep.Tables = append(rep.Tables, TableReport{Table: id.String(), Verdict: VerdictError, Error: err.Error()})
			continue
		}
		spec, sums := tableSpec(t, opt.TargetSchema, cfg, opt.Zone, from, now)
		eng := &engine{src: src, dst: dst, chunkRows: cfg.ChunkRows, examples: cfg.Examples}
		var bar Progress
		if opt.Progress != nil {
			bar = opt.Progress(id)
			eng.progress = bar.Add
		}
		tr := eng.table(ctx, spec, sums)
		if bar != nil {
			bar.Finish()
		}
		log.Debug("verified table", "table", tr.Table, "verdict", tr.Verdict, "source_rows", tr.SourceRows, "target_rows", tr.TargetRows, "seconds", tr.Seconds)
		rep.Tables = append(rep.Tables, *tr)
	}
	switch rep.ExitCode() {
	case ExitDifferent:
		rep.Verdict = VerdictDifferent
	case ExitError:
		rep.Verdict = VerdictError
	}
	return rep, nil
}

// tableSpec builds the spec of one table from its source schema and the config,
// and returns the columns its daily totals sum. zone gives the source zone
// of a DATETIME column (nil: UTC); since and until bound the event-time
// column when the table has one and since is not zero.
func tableSpec(t *tidemark.Table, targetSchema string, cfg Config, zone func(tidemark.TableID, string) string, since, until time.Time) (*tidemark.VerifySpec, []string) {
	spec := &tidemark.VerifySpec{Table: t, TargetSchema: targetSchema, Zones: map[string]string{}}
	if spec.TargetSchema == "" {
		spec.TargetSchema = t.ID.Database
	}
	for _, c := range t.Columns {
		if c.Kind == tidemark.KindDateTime {
			z := "UTC"
			if zone != nil {
				z = zone(t.ID, c.Name)
			}
			spec.Zones[c.Name] = z
		}
	}
	tc := cfg.Tables[t.ID.String()]
	spec.EventTime = tc.EventTime
	if spec.EventTime != "" && !since.IsZero() {
		spec.Since, spec.Until = since, until
	}
	return spec, tc.Sums
}

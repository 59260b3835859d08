package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"tidemark"
	"tidemark/binlog"
	"tidemark/verify"
)

// verifyTableList is a repeatable --table flag (also comma-separated).
type verifyTableList []string

func (l *verifyTableList) String() string { return strings.Join(*l, ",") }
func (l *verifyTableList) Set(v string) error {
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l = append(*l, p)
		}
	}
	return nil
}

// zoneOf returns the IANA zone of a DATETIME column from the config (as the
// tailer resolves it: column override, table override, source zone).
func zoneOf(bc binlog.Config, id tidemark.TableID, column string) string {
	z := bc.Zone.Location
	if o, ok := bc.ZoneOverrides[id.String()]; ok && o.Location != nil {
		z = o.Location
	}
	if o, ok := bc.ZoneOverrides[id.String()+"."+column]; ok && o.Location != nil {
		z = o.Location
	}
	if z == nil {
		return "UTC"
	}
	return z.String()
}

// verifyTableIDs parses --table values ("db.table").
func verifyTableIDs(tables []string) ([]tidemark.TableID, error) {
	var ids []tidemark.TableID
	for _, t := range tables {
		id, err := tidemark.ParseTableID(t)
		if err != nil {
			return nil, fmt.Errorf("verify: --table: %w", err)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// verifyCmd is `tidemark verify [--table db.t]... [--since D] [--json]`:
// exit 0 when source and target are equal, 1 when they differ, 2 on an
// error (verify.ExitError, exitUsage). section returns the config's verify
// section (nil: none).
type verifyCmd struct {
	cmdBase
	section    func(*Config) VerifyConfig
	tables     verifyTableList
	since      time.Duration
	asJSON     bool
	cpuProfile string
	vc         VerifyConfig
}

func (c *verifyCmd) parseFlags(args []string) error {
	fs := flag.NewFlagSet("verify", flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	path := fs.String("config", "tidemark.yaml", "path to the YAML config")
	fs.Var(&c.tables, "table", "verify only this db.table (repeatable, or comma-separated)")
	fs.DurationVar(&c.since, "since", 0, "compare only rows whose event-time column (verify.tables.T.event_time) is within this duration of now; tables without one are compared whole")
	fs.BoolVar(&c.asJSON, "json", false, "print the report as JSON")
	chunkRows := fs.Int("chunk-rows", 0, "source rows per checksum chunk (default verify.chunk_rows, 10000)")
	examples := fs.Int("examples", 0, "keys listed per kind of difference (default verify.examples, 10)")
	fs.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of the verification to this file")
	if err := fs.Parse(args); err != nil {
		return errPrinted
	}
	cfg, err := LoadConfig(*path)
	if err != nil {
		return fmt.Errorf("tidemark: %w", err)
	}
	if err := cfg.needPostgres("verify"); err != nil {
		return err
	}
	if c.section != nil {
		c.vc = c.section(cfg)
	}
	if err := c.vc.Validate(); err != nil {
		return fmt.Errorf("tidemark: %w", err)
	}
	if *chunkRows > 0 {
		c.vc.ChunkRows = *chunkRows
	}
	if *examples > 0 {
		c.vc.Examples = *examples
	}
	if c.since < 0 {
		return errors.New("tidemark: verify: --since must be positive")
	}
	c.cfg = cfg
	c.setLogger(cfg.Log)
	return nil
}

func (c *verifyCmd) run(ctx context.Context) int {
	if c.cpuProfile != "" {
		stop, err := startCPUProfile(c.cpuProfile)
		if err != nil {
			fmt.Fprintln(c.stderr, "tidemark:", err)
			return verify.ExitError
		}
		defer stop()
	}
	rep, err := runVerify(ctx, c.cfg, c.vc, c.tables, c.since, c.log, c.stderr)
	if err != nil {
		c.log.Error("verify failed", "err", err)
		return verify.ExitError
	}
	if c.asJSON {
		enc := json.NewEncoder(c.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return verify.ExitError
		}
	} else {
		printVerify(c.stdout, rep)
	}
	return rep.ExitCode()
}

// runVerify connects to both sides and verifies the tables (all the
// config includes when tables is empty).
func runVerify(ctx context.Context, cfg *Config, vc VerifyConfig, tables []string, since time.Duration, log *slog.Logger, progressOut io.Writer) (*verify.Report, error) {
	ids, err := verifyTableIDs(tables)
	if err != nil {
		return nil, err
	}
	var cl closers
	defer cl.close()
	src, err := openSource(cfg, log, useVerifier, &cl)
	if err != nil {
		return nil, err
	}
	state, err := openStateTarget(ctx, cfg, log, openCommand, &cl)
	if err != nil {
		return nil, err
	}
	rec, err := need[verifyRunRecorder](state, "tidemark verify")
	if err != nil {
		return nil, err
	}
	if state.verifier == nil {
		return nil, fmt.Errorf("tidemark verify needs target.%s to compute checksums (tidemark.TargetVerifier), which it does not", state.name)
	}
	rep, err := verify.Tables(ctx, src.verifier, state.verifier, verifyOptions(src.cfg, cfg.Target.Postgres.Schema, vc, ids, since, log, progressOut))
	if err != nil {
		return nil, err
	}
	// Kept in the target for the daemon's status page and metrics; the
	// report stands without it.
	if err := rec.RecordVerifyRun(ctx, rep.Run()); err != nil {
		log.Warn("could not record the verify run in the target", "err", err)
	}
	return rep, nil
}

// verifyOptions is the run of the tables ids (all when empty) of the
// source bc into targetSchema, with a progress bar per table on
// progressOut.
func verifyOptions(bc binlog.Config, targetSchema string, vc VerifyConfig, ids []tidemark.TableID, since time.Duration, log *slog.Logger, progressOut io.Writer) verify.Options {
	return verify.Options{
		Source: bc.Name, TargetSchema: targetSchema, Config: vc.engine(), Tables: ids, Since: since, Logger: log,
		Zone: func(id tidemark.TableID, column string) string { return zoneOf(bc, id, column) },
		Progress: func(id tidemark.TableID) verify.Progress {
			return NewProgress(progressOut, "verify "+id.String(), -1, log)
		},
	}
}

func fmtKey(k []string) string { return "(" + strings.Join(k, ", ") + ")" }

func fmtVal(v *string) string {
	if v == nil {
		return "NULL"
	}
	return strconv.Quote(*v)
}

// printVerify writes the readable report: one line per table, then the
// details of every table that is not equal.
func printVerify(w io.Writer, rep *verify.Report) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TABLE\tSOURCE ROWS\tTARGET ROWS\tCHUNKS\tDIFFERING\tMISSING\tEXTRA\tCHANGED\tDUP KEYS\tDAYS DIFFERING\tVERDICT")
	for _, t := range rep.Tables {
		days := "-"
		if t.Days > 0 {
			days = fmt.Sprintf("%d/%d", len(t.DaysDiffering), t.Days)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\n", t.Table, t.SourceRows, t.TargetRows, t.Chunks,
			t.ChunksDiffering, t.Missing, t.Extra, t.Changed, t.DuplicateKeys, days, strings.ToUpper(t.Verdict))
	}
	tw.Flush()
	for _, t := range rep.Tables {
		if t.Verdict == verify.VerdictEqual {
			continue
		}
		fmt.Fprintf(w, "\n%s → %s:\n", t.Table, t.Target)
		if t.Error != "" {
			fmt.Fprintf(w, "  error: %s\n", t.Error)
			continue
		}
		if t.SourceRows != t.TargetRows {
			fmt.Fprintf(w, "  row count: source %d, target %d\n", t.SourceRows, t.TargetRows)
		}
		for _, k := range t.MissingKeys {
			fmt.Fprintf(w, "  missing in target: %s\n", fmtKey(k))
		}
		if n := t.Missing - len(t.MissingKeys); n > 0 {
			fmt.Fprintf(w, "  … and %d more missing\n", n)
		}
		for _, k := range t.ExtraKeys {
			fmt.Fprintf(w, "  extra in target:   %s\n", fmtKey(k))
		}
		if n := t.Extra - len(t.ExtraKeys); n > 0 {
			fmt.Fprintf(w, "  … and %d more extra\n", n)
		}
		for _, c := range t.ChangedRows {
			fmt.Fprintf(w, "  changed:           %s\n", fmtKey(c.Key))
			for _, d := range c.Columns {
				fmt.Fprintf(w, "      %s: source %s, target %s\n", d.Column, fmtVal(d.Source), fmtVal(d.Target))
			}
		}
		if n := t.Changed - len(t.ChangedRows); n > 0 {
			fmt.Fprintf(w, "  … and %d more changed\n", n)
		}
		for _, d := range t.Duplicates {
			fmt.Fprintf(w, "  duplicate key:     %s held by %d rows\n", fmtKey(d.Key), d.Rows)
		}
		for _, d := range t.DaysDiffering {
			fmt.Fprintf(w, "  day %s (UTC): count source %d, target %d", d.Day, d.SourceCount, d.TargetCount)
			for i, s := range t.Sums {
				fmt.Fprintf(w, "; SUM(%s) source %s, target %s", s, orNull(d.SourceSums, i), orNull(d.TargetSums, i))
			}
			fmt.Fprintln(w)
		}
	}
	fmt.Fprintf(w, "\nverdict: %s\n", strings.ToUpper(rep.Verdict))
}

func orNull(s []string, i int) string {
	if i >= len(s) || s[i] == "" {
		return "NULL"
	}
	return s[i]
}

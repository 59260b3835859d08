package main

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"strings"
	"text/tabwriter"
	"time"

	"tidemark"
	"tidemark/binlog"
	"tidemark/checkpoint"
	"tidemark/fallback"
	"tidemark/integration/harness"
	"tidemark/sink/postgres"
)

// snapshotProfile is the -snapshot-cpuprofile flag: a CPU profile of the
// first full reload of the fallback bench.
var snapshotProfile string

// fallbackChunkRows is the -chunk-rows flag: fallback.chunk_rows of the
// fallback bench (0: tidemark's default).
var fallbackChunkRows int

// fallbackRun is one run of the fallback bench.
type fallbackRun struct {
	full     time.Duration // full reload (snapshot of every row)
	fullRows int64
	first    time.Duration // R7: the first catch-up after 0.1% of rows changed
	firstRep fallback.TableReport
	reruns   []time.Duration // catch-ups of the same, unchanged window
	calls    string          // where the first catch-up's time went
}

// benchFallback compares a catch-up of a table where 0.1% of the rows
// changed with a full reload of the same table. Each run reloads the table
// in full (tidemark's own snapshot: the same read and apply path, every
// row), changes 0.1% of the rows, then times the FIRST catch-up, which reads
// the window and applies the changed rows: R7 = full / first catch-up. Two
// more catch-ups of the same, now unchanged, window follow and are shown
// apart (the incident's hourly re-runs); they never enter R7.
// It returns R7 of each run.
func benchFallback(ctx context.Context, rows, runs int, out string) ([]float64, error) {
	sv, err := connect(ctx)
	if err != nil {
		return nil, err
	}
	defer sv.close(ctx)
	env, my, pg := sv.env, sv.my, sv.pg
	const db = "tidemark_bench_fb"
	fmt.Fprintf(os.Stderr, "== loading %d rows\n", rows)
	t0 := time.Now()
	if err := harness.Exec(my, "DROP DATABASE IF EXISTS "+db, "CREATE DATABASE "+db, "USE "+db,
		`CREATE TABLE big (id BIGINT PRIMARY KEY, amount DECIMAL(12,2) NOT NULL, name VARCHAR(64) NOT NULL,
			updated_at DATETIME(6) NOT NULL, KEY (updated_at))`,
		"SET time_zone = '"+zone+"'"); err != nil {
		return nil, err
	}
	for lo := 0; lo < rows; lo += 100000 {
		n := min(100000, rows-lo)
		if err := harness.Exec(my, fmt.Sprintf(`INSERT INTO big SELECT %d + seq, seq / 100, CONCAT('row-', seq), NOW(6) - INTERVAL 400 DAY + INTERVAL (%d + seq) SECOND FROM seq_1_to_%d`, lo, lo, n)); err != nil {
			return nil, err
		}
	}
	fmt.Fprintf(os.Stderr, "   loaded in %s\n", time.Since(t0).Round(time.Millisecond))

	loc, _ := time.LoadLocation(zone)
	reader, err := binlog.NewReader(binlog.Config{Name: "bench_fb", Addr: env.MySQLAddr, User: env.MySQLUser, Password: env.MySQLPassword,
		ServerID: 7300, Include: []string{db + ".big"}, Zone: tidemark.ZonePolicy{Location: loc}})
	if err != nil {
		return nil, err
	}
	defer reader.Close()
	store, err := checkpoint.New(checkpoint.Config{})
	if err != nil {
		return nil, err
	}
	sink, err := postgres.Open(ctx, postgres.Config{DSN: env.PGDSN, Checkpoints: store})
	if err != nil {
		return nil, err
	}
	defer sink.Close()
	var calls callTimes
	cu, err := fallback.New(fallback.Config{Source: "fallback_bench", ChunkRows: fallbackChunkRows, Tables: map[string]fallback.TableConfig{db + ".big": {Column: "updated_at", Lookback: time.Minute}}},
		// The sink lists the target's keys too: since f8a0fb2 a
		// window catch-up into a target that holds rows ends with the key
		// diff, and without keys it stops ("the target lists no keys to
		// diff"), which the wrapper alone, hiding the sink's KeyTarget, made
		// every run of this bench do. The diff's calls are timed too
		// (source.KeyRangeSum and target.KeyRangeSum run at the same time).
		timedSource{reader, &calls}, timedTarget{sink, &calls}, timedKeys{sink, &calls})
	if err != nil {
		return nil, err
	}
	only := []tidemark.TableID{{Database: db, Name: "big"}}
	changed := rows / 1000

	var all []fallbackRun
	for run := 1; run <= runs; run++ {
		var fr fallbackRun
		if run == 1 {
			_, _ = pg.Exec(ctx, "DROP SCHEMA IF EXISTS "+db+" CASCADE")
		} else {
			// The sink knows the table now: empty it rather than drop it.
			if _, err := pg.Exec(ctx, "TRUNCATE "+db+".big"); err != nil {
				return nil, err
			}
		}
		_, _ = pg.Exec(ctx, "DELETE FROM tidemark.watermarks WHERE source = 'fallback_bench'")
		fmt.Fprintf(os.Stderr, "== [%d] full reload (snapshot of every row)\n", run)
		if snapshotProfile != "" && run == 1 {
			pf, err := os.Create(snapshotProfile)
			if err != nil {
				return nil, err
			}
			defer pf.Close()
			if err := pprof.StartCPUProfile(pf); err != nil {
				return nil, err
			}
		}
		full, err := cu.RunReport(ctx, only)
		if snapshotProfile != "" && run == 1 {
			pprof.StopCPUProfile()
		}
		if err != nil {
			return nil, err
		}
		fr.full, fr.fullRows = full.Took, full.Tables[0].Rows
		fmt.Fprintf(os.Stderr, "   full reload %s: reading %s, applying %s (they overlap)\n", full.Took.Round(time.Millisecond),
			full.Tables[0].ReadTime.Round(time.Millisecond), full.Tables[0].ApplyTime.Round(time.Millisecond))
		// A different 0.1% each run, stamped now: only they are in the
		// window after the watermark.
		if err := harness.Exec(my, fmt.Sprintf("UPDATE %s.big SET amount = amount + 1, updated_at = NOW(6) WHERE id %% 1000 = %d", db, run)); err != nil {
			return nil, err
		}
		fmt.Fprintf(os.Stderr, "== [%d] first catch-up after %d rows (0.1%%) changed, then 2 re-runs of the unchanged window\n", run, changed)
		for i := 0; i < 3; i++ {
			calls.reset()
			r, err := cu.RunReport(ctx, only)
			if err != nil {
				return nil, err
			}
			if i == 0 {
				fr.calls = calls.String()
				fmt.Fprintf(os.Stderr, "   first catch-up %s: %s\n", r.Took.Round(100*time.Microsecond), fr.calls)
				fr.first, fr.firstRep = r.Took, r.Tables[0]
				if int(r.Tables[0].Applied.Updated) != changed {
					return nil, fmt.Errorf("first catch-up updated %d rows, want %d", r.Tables[0].Applied.Updated, changed)
				}
			} else {
				fr.reruns = append(fr.reruns, r.Took)
			}
		}
		fmt.Fprintf(os.Stderr, "   full %s, first catch-up %s (read %s, apply %s), re-runs %v\n", fr.full.Round(time.Millisecond),
			fr.first.Round(time.Millisecond), fr.firstRep.ReadTime.Round(time.Millisecond), fr.firstRep.ApplyTime.Round(time.Millisecond), fr.reruns)
		all = append(all, fr)
	}
	hwm, _ := vmHWM("self")

	var fulls, firsts, reruns, r7s, rrs []float64
	var per []string
	for _, fr := range all {
		fulls = append(fulls, fr.full.Seconds())
		firsts = append(firsts, fr.first.Seconds())
		r7 := fr.full.Seconds() / fr.first.Seconds()
		r7s = append(r7s, r7)
		per = append(per, fmt.Sprintf("%.0f×", r7))
		for _, d := range fr.reruns {
			reruns = append(reruns, d.Seconds())
			rrs = append(rrs, fr.full.Seconds()/d.Seconds())
		}
	}
	sec := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)).Round(time.Millisecond) }
	target := 200.0
	if rows >= 10_000_000 {
		target = 1000
	}
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "measure (median of %d runs)\tvalue\t\n", runs)
	fmt.Fprintf(tw, "full reload, %d rows\t%s (%.0f rows/s)\t\n", all[0].fullRows, sec(medianOf(fulls)), float64(all[0].fullRows)/medianOf(fulls))
	fmt.Fprintf(tw, "first catch-up: %d rows read, %d updated\t%s\t\n", all[0].firstRep.Rows, all[0].firstRep.Applied.Updated, sec(medianOf(firsts)))
	fmt.Fprintf(tw, "re-runs of the unchanged window (%d)\t%s\t\n", len(reruns), sec(medianOf(reruns)))
	fmt.Fprintf(tw, "R7 = full reload / first catch-up\t%s → median %.0f×\ttarget ≥ %.0f×: %s\n", strings.Join(per, " "), medianOf(r7s), target, pass(medianOf(r7s) >= target))
	fmt.Fprintf(tw, "full reload / re-run (not R7: nothing to apply)\tmedian %.0f×\t\n", medianOf(rrs))
	fmt.Fprintf(tw, "peak RSS (VmHWM) of the bench process (loader, reader and sink in one)\t%.0f MiB\t\n", float64(hwm)/1024)
	tw.Flush()
	b.WriteString("\nWhere each run's first catch-up spent its time (calls into the source and the target; the rest is the catch-up's own work):\n")
	for i, fr := range all {
		fmt.Fprintf(&b, "  run %d, %s: %s\n", i+1, fr.first.Round(100*time.Microsecond), fr.calls)
	}
	fmt.Print(b.String())
	if out == "" {
		return r7s, nil
	}
	return r7s, replaceSection(out, fmt.Sprintf("fallback-%d", rows), fmt.Sprintf("## Fallback catch-up versus full reload, %d rows (`make bench-fallback`, %s)\n\n%d-row table, DATETIME watermark column indexed; 0.1%% of the rows changed before each first catch-up; full reload and catch-ups through the same reader and sink, in one process. %s\n\n```\n%s```\n",
		rows, time.Now().UTC().Format("2006-01-02 15:04 UTC"), rows, machine(), b.String()))
}

// replaceSection writes body into the report between the markers of the
// named section, replacing an earlier run's, or appends it.
func replaceSection(path, name, body string) error {
	begin, end := "<!-- bench:"+name+" -->\n", "<!-- /bench:"+name+" -->\n"
	old, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	s := string(old)
	sec := begin + body + end
	if i := strings.Index(s, begin); i >= 0 {
		if j := strings.Index(s[i:], end); j >= 0 {
			s = s[:i] + sec + s[i+j+len(end):]
			return os.WriteFile(path, []byte(s), 0o644)
		}
	}
	if s != "" && !strings.HasSuffix(s, "\n\n") {
		s += "\n"
	}
	return os.WriteFile(path, []byte(s+sec), 0o644)
}

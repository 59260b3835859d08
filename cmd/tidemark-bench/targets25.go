package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"
)

// targetRow is one line of issue 25's Targets table.
type targetRow struct {
	figure, before, now, target, verdict, load string
}

// perRun formats per-run values with format, space-separated.
func perRun(v []float64, format string) string {
	var s []string
	for _, x := range v {
		s = append(s, fmt.Sprintf(format, x))
	}
	return strings.Join(s, " ")
}

// both is "met" when every verdict is.
func both(ok ...bool) string {
	for _, b := range ok {
		if !b {
			return pass(false)
		}
	}
	return pass(true)
}

// benchTargets25 runs every benchmark of issue 25's Targets table one
// after the other with one tidemark binary — the beside-stream lag, the
// peers at 1M rows (with the streaming drain), the parallel snapshot ÷ one
// COPY stream, the Kafka tailer ÷ run → PostgreSQL, R7 at 1M; with
// o.longRows (10M) also the peers and R7 at that size — each writing its
// own section as its own command does, then prints the Targets table
// (median of o.runs runs per figure, each run's values beside it, the load
// average before → after each part) and writes it as section targets-25.
// A part that fails is shown as failed and the command exits non-zero
// after the others ran.
func benchTargets25(ctx context.Context, o options) error {
	start := loadAvg()
	cleanup, err := buildTidemark(&o)
	if err != nil {
		return err
	}
	defer cleanup()
	var failed []error
	part := func(name string, f func(o options) error) (load string, err error) {
		loadAtStart = loadAvg()
		fmt.Fprintf(os.Stderr, "=== issue 25: %s (load %s)\n", name, loadAtStart)
		t0 := time.Now()
		err = f(o)
		load = fmt.Sprintf("%s → %s (%s)", strings.Fields(loadAtStart)[0], strings.Fields(loadAvg())[0], time.Since(t0).Round(time.Second))
		if err != nil {
			failed = append(failed, fmt.Errorf("%s: %w", name, err))
			fmt.Fprintf(os.Stderr, "=== issue 25: %s FAILED: %v\n", name, err)
		}
		return load, err
	}
	failedRow := func(figure, before, target, load string, err error) targetRow {
		return targetRow{figure, before, "failed: " + firstLine(err.Error()), target, "—", load}
	}
	var rows []targetRow

	// 1. The beside-stream lag.
	var bs besideSummary
	load, err := part(fmt.Sprintf("snapshot beside the stream, %d rows", o.besideRows), func(o options) error {
		o.besideTopology = "postgres"
		bs, err = benchBeside(ctx, o)
		return err
	})
	fig := fmt.Sprintf("p99 lag of a busy small table while a %s-row table is snapshotted beside it", count(o.besideRows))
	if err != nil {
		rows = append(rows, failedRow(fig, "the whole snapshot (≈ 20–25 s)", "≤ 1 s", load, err))
	} else {
		var idle, snap []float64
		for _, r := range bs.runs {
			idle = append(idle, float64(r.idle.p99.Milliseconds()))
			snap = append(snap, r.snapshot.Seconds())
		}
		m := medianOf(bs.p99s())
		rows = append(rows, targetRow{fig, "the whole snapshot (≈ 20–25 s)",
			fmt.Sprintf("%.0f ms (%s); no snapshot, same run: %.0f ms (%s); snapshot took %.1f s", m, perRun(bs.p99s(), "%.0f"), medianOf(idle), perRun(idle, "%.0f"), medianOf(snap)),
			"≤ 1 s", pass(m <= 1000), load})
	}

	// 2. Peers at 1M rows, with the drain.
	var ps peersSummary
	load, err = part("peers at 1M rows (pgloader, pg_chameleon init_replica and start_replica)", func(o options) error {
		o.peerRows, o.drainRuns = 1000000, o.runs
		ps, err = benchPeers(ctx, o)
		return err
	})
	fig = "first-run snapshot, 1M rows: pgloader time ÷ tidemark time; pg_chameleon init_replica ÷ tidemark"
	drainFig := "streaming drain, tidemark ÷ pg_chameleon start_replica, same backlog"
	if err != nil {
		rows = append(rows, failedRow(fig, "1.24×; 1.15×", "≥ 2× both", load, err), failedRow(drainFig, "9.4×", "≥ 10×", load, err))
	} else {
		p, c := medianOf(ps.pgloader), medianOf(ps.chameleon)
		rows = append(rows, targetRow{fig, "1.24×; 1.15×",
			fmt.Sprintf("%.2f× (%s); %.2f× (%s)", p, perRun(ps.pgloader, "%.2f"), c, perRun(ps.chameleon, "%.2f")),
			"≥ 2× both", both(p >= 2, c >= 2), load})
		d := medianOf(ps.drain)
		rows = append(rows, targetRow{drainFig, "9.4×", fmt.Sprintf("%.1f× (%s)", d, perRun(ps.drain, "%.1f")), "≥ 10×", pass(d >= 10), load})
	}

	// 3. The same at 10M rows, with peak RSS.
	fig = fmt.Sprintf("the same at %s rows, peak RSS of each", count(max(o.longRows, 10000000)))
	if o.longRows == 0 {
		rows = append(rows, targetRow{fig, "not run", "not run (make bench-25 ROWS=10000000)", "≥ 2× both, peak RSS ≤ 256 MiB", "—", ""})
	} else {
		var pl peersSummary
		load, err = part(fmt.Sprintf("peers at %d rows", o.longRows), func(o options) error {
			o.peerRows, o.drainRuns = o.longRows, 0
			pl, err = benchPeers(ctx, o)
			return err
		})
		if err != nil {
			rows = append(rows, failedRow(fig, "not run", "≥ 2× both, peak RSS ≤ 256 MiB", load, err))
		} else {
			p, c := medianOf(pl.pgloader), medianOf(pl.chameleon)
			mib := func(kib int64) float64 { return float64(kib) / 1024 }
			rows = append(rows, targetRow{fig, "not run",
				fmt.Sprintf("%.2f× (%s); %.2f× (%s); peak RSS tidemark %.0f MiB, pgloader %.0f MiB, pg_chameleon %.0f MiB", p, perRun(pl.pgloader, "%.2f"), c, perRun(pl.chameleon, "%.2f"),
					mib(pl.tidemarkRSS), mib(pl.pgloaderRSS), mib(pl.chameleonRSS)),
				"≥ 2× both, peak RSS ≤ 256 MiB", both(p >= 2, c >= 2, pl.tidemarkRSS <= 256*1024), load})
		}
	}

	// 4. Parallel snapshot ÷ one COPY stream.
	var sp map[int][]float64
	load, err = part("parallel snapshot ÷ one COPY stream, 1M rows", func(o options) error {
		o.snapParRows = 1000000
		sp, err = benchSnapshotParallel(ctx, o)
		return err
	})
	fig = "snapshot rows/s ÷ single COPY stream ceiling (same run), 1M rows"
	if err != nil {
		rows = append(rows, failedRow(fig, "0.82", "≥ 1.2 (parallel)", load, err))
	} else {
		def := medianOf(sp[2])
		rows = append(rows, targetRow{fig, "0.82",
			fmt.Sprintf("parallelism 2 (default): %.2f (%s); 1: %.2f; 4: %.2f", def, perRun(sp[2], "%.2f"), medianOf(sp[1]), medianOf(sp[4])),
			"≥ 1.2 (parallel)", pass(def >= 1.2), load})
	}

	// 5. The Kafka tailer ÷ run → PostgreSQL.
	var kd []float64
	load, err = part("Kafka tailer (exactly-once) ÷ run → PostgreSQL, 100k inserts + 25k updates", func(o options) error {
		o.applyRows, o.appliers = 100000, 0
		if o.out != "" {
			o.out = filepath.Join(filepath.Dir(o.out), "SCALE-OUT.md")
		}
		kd, err = benchApply(ctx, o)
		return err
	})
	fig = "Kafka tailer (exactly-once) ÷ `run` → PostgreSQL (K/D)"
	if err != nil {
		rows = append(rows, failedRow(fig, "0.17", "≥ 0.8", load, err))
	} else {
		m := medianOf(kd)
		rows = append(rows, targetRow{fig, "0.17", fmt.Sprintf("%.2f (%s)", m, perRun(kd, "%.2f")), "≥ 0.8", pass(m >= 0.8), load})
	}

	// 6. R7 at 1M and, with o.longRows, at that size.
	var r7, r7l []float64
	load, err = part("R7, fallback catch-up ÷ full reload, 1M rows", func(o options) error {
		r7, err = benchFallback(ctx, 1000000, o.runs, o.out)
		return err
	})
	fig = "R7, first catch-up vs full reload, 1M / 10M"
	r7Now := "failed: " + errText(err)
	var r7ok []bool
	if err == nil {
		r7Now = fmt.Sprintf("%.0f× (%s)", medianOf(r7), perRun(r7, "%.0f"))
		r7ok = append(r7ok, medianOf(r7) >= 200)
	}
	if o.longRows == 0 {
		r7Now += " / not run (ROWS=10000000)"
	} else {
		var l string
		l, err = part(fmt.Sprintf("R7 at %d rows", o.longRows), func(o options) error {
			r7l, err = benchFallback(ctx, o.longRows, o.runs, o.out)
			return err
		})
		load += "; " + l
		if err != nil {
			r7Now += " / failed: " + errText(err)
		} else {
			r7Now += fmt.Sprintf(" / %.0f× (%s)", medianOf(r7l), perRun(r7l, "%.0f"))
			r7ok = append(r7ok, medianOf(r7l) >= 1000)
		}
	}
	verdict := "—"
	if len(r7ok) > 0 {
		verdict = both(r7ok...)
		if o.longRows == 0 && r7ok[0] {
			verdict = "met at 1M (10M not run)"
		}
	}
	rows = append(rows, targetRow{fig, "88× / 69×", r7Now, "≥ 200× / ≥ 1000×", verdict, load})

	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "figure\tissue 25 (before)\tnow: median of %d (per run)\ttarget\tverdict\tload 1-min before → after (part's time)\n", o.runs)
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.figure, r.before, r.now, r.target, r.verdict, r.load)
	}
	tw.Flush()
	fmt.Print("\n" + b.String())
	loadAtStart = start
	if o.out != "" {
		if err := replaceSection(o.out, "targets-25", fmt.Sprintf("## Issue 25 Targets (`make bench-25`, %s)\n\nEvery benchmark of issue 25's Targets table, one after the other with one tidemark binary (`go run ./cmd/tidemark-bench -targets25 -beside-rows %d -long-rows %d -runs %d`); each part wrote its own section (below, and the K/D runs in docs/SCALE-OUT.md). Each figure divides two measurements of the same run; medians of %d runs, per run in brackets. %s\n\n```\n%s```\n",
			time.Now().UTC().Format("2006-01-02 15:04 UTC"), o.besideRows, o.longRows, o.runs, o.runs, machine(), b.String())); err != nil {
			failed = append(failed, err)
		}
	}
	return errors.Join(failed...)
}

// errText is the first line of err's text, or "" for nil.
func errText(err error) string {
	if err == nil {
		return ""
	}
	return firstLine(err.Error())
}

// count writes 5000000 as 5M, 1500000 as 1.5M, 1000 as 1000.
func count(n int) string {
	switch {
	case n >= 1000000 && n%100000 == 0:
		return strings.TrimSuffix(strings.TrimSuffix(fmt.Sprintf("%.1f", float64(n)/1e6), "0"), ".") + "M"
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}

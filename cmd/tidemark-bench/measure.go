package main

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/go-mysql-org/go-mysql/client"
	"github.com/jackc/pgx/v5"

	"tidemark"
	"tidemark/integration/harness"
)

// backlog is where the loaded backlogs are in the source's binlog.
type backlog struct {
	ddlStart, updStart, updEnd, insStart, insEnd tidemark.Position
	insRows, updRows                             int
}

// runFigures are the measurements of one run and the ratios between them
// (a ratio only ever divides two figures of the same run).
type runFigures struct {
	results                    []result
	r1, r2i, r2u, r2w, r3, r3b float64
	rv                         float64
	p50, p99                   time.Duration
	lagRows                    int
	lagRate                    float64
	rss                        int64 // KiB, the largest VmHWM of the daemons of this run
}

// resetTargets removes what earlier runs left in PostgreSQL: the schemas
// whose names start with prefix (but those named in keep) and the control
// rows of the sources named so. Each bench has its own prefix ("bench_" for
// make bench, "peers_" for make bench-peers), so that they never touch each
// other's tables.
func resetTargets(ctx context.Context, pg *pgx.Conn, prefix string, keep ...string) error {
	like := strings.ReplaceAll(prefix, "_", `\_`) + "%"
	rows, err := pg.Query(ctx, `SELECT nspname FROM pg_namespace WHERE nspname LIKE $1`, like)
	if err != nil {
		return err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for _, n := range names {
		if slices.Contains(keep, n) {
			continue
		}
		if _, err := pg.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{n}.Sanitize()+" CASCADE"); err != nil {
			return fmt.Errorf("drop schema %s: %w", n, err)
		}
	}
	for _, t := range []string{"checkpoints", "tables", "watermarks"} {
		// The control tables exist once a daemon has run.
		_, _ = pg.Exec(ctx, "DELETE FROM tidemark."+t+" WHERE source LIKE $1", like)
	}
	return nil
}

// measure runs every measurement once against the loaded backlog.
func measure(ctx context.Context, o options, env harness.Env, my *client.Conn, pg *pgx.Conn, bl backlog, run int) (runFigures, error) {
	var f runFigures
	step := func(s string) { fmt.Fprintf(os.Stderr, "== [%d] %s\n", run, s) }
	step("C1 raw go-mysql decode (no-op handler)")
	c1, err := rawDecode(ctx, env, bl.insStart, bl.insEnd)
	if err != nil {
		return f, err
	}

	step("T1 tidemark tailer + UTC normalization + dedupe → null sink")
	profile := o.t1Profile != "" && run == 1
	if profile {
		pf, err := os.Create(o.t1Profile)
		if err != nil {
			return f, err
		}
		defer pf.Close()
		if err := pprof.StartCPUProfile(pf); err != nil {
			return f, err
		}
	}
	t1, err := tailerOnly(ctx, env, bl.insStart, bl.insEnd)
	if profile {
		pprof.StopCPUProfile()
	}
	if err != nil {
		return f, err
	}

	step("C2 PostgreSQL COPY of the same rows")
	c2, err := copyCeiling(ctx, pg, "bench_ceiling", bl.insRows)
	if err != nil {
		return f, err
	}

	step("C3 naive per-row autocommit upsert (sample)")
	c3, err := naive(ctx, pg, o.naive)
	if err != nil {
		return f, err
	}

	step("C3b go-mysql canal + batched multi-row INSERT … ON CONFLICT")
	c3b, err := canalBaseline(ctx, env, pg, bl.insStart, bl.insEnd, bl.insRows)
	if err != nil {
		return f, err
	}

	step("T2 tidemark end to end, insert-heavy")
	var t2Args []string
	if o.t2Profile != "" && run == 1 {
		t2Args = []string{"--cpuprofile", o.t2Profile}
	}
	src := func(s string) string { return fmt.Sprintf("bench_%s_%d", s, run) }
	t2i, rssIns, err := endToEnd(ctx, o.bin, env, pg, src("ins"), "ins", bl.ddlStart, bl.insEnd, bl.insRows, t2Args...)
	if err != nil {
		return f, err
	}

	step("V tidemark verify of the insert-heavy table")
	vr, err := verifyRun(o.bin, env, src("ins"), "ins", bl.insRows)
	if err != nil {
		return f, err
	}

	step("T2 tidemark end to end, update-heavy")
	t2u, rssUpd, err := endToEnd(ctx, o.bin, env, pg, src("upd"), "upd", bl.updStart, bl.updEnd, bl.updRows)
	if err != nil {
		return f, err
	}
	// What reached PostgreSQL: most of the Zipf updates of one batch fall
	// on the same keys and are coalesced before the target.
	written, err := rowsWritten(ctx, pg, src("upd"), "upd")
	if err != nil {
		return f, err
	}
	t2u.name = "T2 update-heavy, source changes drained"
	t2w := result{name: "T2 update-heavy, rows written to PostgreSQL", rows: int(written), took: t2u.took,
		extra: "pg_stat_user_tables n_tup_ins+upd+del"}

	step("T3 lag at 50% of T2's insert-heavy rate")
	if err := harness.Exec(my, "TRUNCATE TABLE "+benchDB+".lag"); err != nil {
		return f, err
	}
	f.lagRate = t2i.rate() / 2
	var rssLag int64
	f.p50, f.p99, f.lagRows, rssLag, err = lag(ctx, o, env, my, pg, src("lag"), f.lagRate)
	if err != nil {
		return f, err
	}
	f.results = []result{c1, t1, c2, c3, c3b, t2i, vr, t2u, t2w}
	f.rss = max(rssIns, rssUpd, rssLag)
	f.r1 = t1.rate() / c1.rate()
	f.r2i = t2i.rate() / c2.rate()
	f.r2u = t2u.rate() / c2.rate()
	f.r2w = t2w.rate() / c2.rate()
	f.r3 = t2i.rate() / c3.rate()
	f.r3b = t2i.rate() / c3b.rate()
	f.rv = vr.rate() / t2i.rate()
	return f, nil
}

// table prints one run's measurements.
func (f runFigures) table(runs int) string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "measure\trows\ttime\trows/s\tnote")
	for _, r := range f.results {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%.0f\t%s\n", r.name, r.rows, r.took.Round(time.Millisecond), r.rate(), r.extra)
	}
	fmt.Fprintf(tw, "T3 lag p50 / p99 (%d rows at %.0f rows/s)\t\t%s / %s\t\t\n", f.lagRows, f.lagRate, f.p50.Round(time.Millisecond), f.p99.Round(time.Millisecond))
	tw.Flush()
	return b.String()
}

func medianOf(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// report is the median of every figure over the runs, each run's ratios
// shown beside it.
func report(runs []runFigures) string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "measure (median of %d runs)\trows\ttime\trows/s\tnote\n", len(runs))
	for i, r := range runs[0].results {
		var took, rate []float64
		for _, f := range runs {
			took = append(took, f.results[i].took.Seconds())
			rate = append(rate, f.results[i].rate())
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%.0f\t%s\n", r.name, r.rows, time.Duration(medianOf(took)*float64(time.Second)).Round(time.Millisecond), medianOf(rate), r.extra)
	}
	tw.Flush()
	b.WriteString("\n")
	tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ratio (each measured within one run)\tper run\tmedian\ttarget\t")
	line := func(name string, get func(runFigures) float64, format, target string, ok func(float64) bool) {
		var v []float64
		var per []string
		for _, f := range runs {
			v = append(v, get(f))
			per = append(per, fmt.Sprintf(format, get(f)))
		}
		m := medianOf(v)
		verdict := ""
		if ok != nil {
			verdict = pass(ok(m))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", name, strings.Join(per, " "), fmt.Sprintf(format, m), target, verdict)
	}
	line("R1 = T1/C1 (tailer vs raw go-mysql decode)", func(f runFigures) float64 { return f.r1 }, "%.2f", "≥ 0.85", func(m float64) bool { return m >= 0.85 })
	line("R2 insert-heavy = source changes/s ÷ COPY rows/s", func(f runFigures) float64 { return f.r2i }, "%.2f", "≥ 0.60", func(m float64) bool { return m >= 0.6 })
	line("R2u update-heavy = source changes drained/s ÷ COPY rows/s", func(f runFigures) float64 { return f.r2u }, "%.2f", "none set", nil)
	line("R2w update-heavy = rows written/s ÷ COPY rows/s", func(f runFigures) float64 { return f.r2w }, "%.2f", "none set", nil)
	line("R3 = T2/C3 (vs naive per-row autocommit upsert)", func(f runFigures) float64 { return f.r3 }, "%.0f×", "≥ 40×", func(m float64) bool { return m >= 40 })
	line("R3b = T2/C3b (vs canal + batched multi-row upsert)", func(f runFigures) float64 { return f.r3b }, "%.2f×", "none set", nil)
	line("RV = verify rows/s ÷ T2 apply rows/s, same table", func(f runFigures) float64 { return f.rv }, "%.2f", "≥ 1.0", func(m float64) bool { return m >= 1 })
	line("T3 p50 lag, source commit → visible in PostgreSQL (ms)", func(f runFigures) float64 { return float64(f.p50.Milliseconds()) }, "%.0f", "", nil)
	line("T3 p99 lag, source commit → visible in PostgreSQL (ms)", func(f runFigures) float64 { return float64(f.p99.Milliseconds()) }, "%.0f", "≤ 500", func(m float64) bool { return m <= 500 })
	var peak int64
	for _, f := range runs {
		peak = max(peak, f.rss)
	}
	line("peak RSS (VmHWM) of the tidemark daemons (MiB)", func(f runFigures) float64 { return float64(f.rss) / 1024 }, "%.0f", "≤ 256 (max)", nil)
	fmt.Fprintf(tw, "  largest of all runs\t\t%.0f MiB\t≤ 256 MiB\t%s\n", float64(peak)/1024, pass(peak <= 256*1024))
	tw.Flush()
	return b.String()
}

package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"tidemark"
)

// snapParLevels are the snapshot.parallelism values benchSnapshotParallel
// measures.
var snapParLevels = []int{1, 2, 4}

// snapParRun is one run of one parallelism.
type snapParRun struct {
	took    time.Duration // tidemark catchup, first run (no checkpoint)
	ceiling result        // one COPY stream, right before it
	load    string        // load average after it
}

// benchSnapshotParallel measures tidemark's first-run snapshot (`tidemark
// catchup` with no checkpoint, what `tidemark run` does first) of the
// peers' table at each of snapParLevels, each right after the COPY ceiling
// (one pgx CopyFrom of rows of the same shape) measured in the same run:
// the ratio of the two rates is the figure, medians of o.runs runs. The
// copy of each parallelism's first run is checked with `tidemark verify`.
// It returns each parallelism's per-run ratios.
func benchSnapshotParallel(ctx context.Context, o options) (map[int][]float64, error) {
	sv, err := connect(ctx)
	if err != nil {
		return nil, err
	}
	defer sv.close(ctx)
	env, pg := sv.env, sv.pg
	cleanup, err := buildTidemark(&o)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	rows := o.snapParRows
	if err := loadPeersTable(sv.my, rows); err != nil {
		return nil, err
	}
	if err := resetTargets(ctx, pg, "snappar_"); err != nil {
		return nil, err
	}
	runChild := func(par int, source string, args ...string) ([]byte, error) {
		snapshotPar = par
		cfg, err := writeConfigDB(env, source, peersDB, "t", tidemark.Position{})
		snapshotPar = 0
		if err != nil {
			return nil, err
		}
		defer os.Remove(cfg)
		out, err := tidemarkCmd(o.bin, cfg, env, args...)
		return []byte(out), err
	}
	runs := map[int][]snapParRun{}
	ratios := map[int][]float64{}
	verdict := map[int]string{}
	for i := 1; i <= o.runs; i++ {
		for _, par := range snapParLevels {
			var r snapParRun
			fmt.Fprintf(os.Stderr, "== [%d] parallelism %d: C COPY ceiling, then tidemark catchup (load %s)\n", i, par, loadAvg())
			if _, err := pg.Exec(ctx, "DROP SCHEMA IF EXISTS snappar_ceiling CASCADE"); err != nil {
				return nil, err
			}
			if err := quiescePG(ctx, pg, "snappar_"); err != nil {
				return nil, err
			}
			if r.ceiling, err = copyCeiling(ctx, pg, "snappar_ceiling", rows); err != nil {
				return nil, err
			}
			if err := quiescePG(ctx, pg, "snappar_"); err != nil {
				return nil, err
			}
			source := fmt.Sprintf("snappar_p%d_%d", par, i)
			t0 := time.Now()
			if out, err := runChild(par, source, "catchup"); err != nil {
				return nil, fmt.Errorf("tidemark catchup at parallelism %d: %v\n%s", par, err, out)
			}
			r.took, r.load = time.Since(t0), loadAvg()
			fmt.Fprintf(os.Stderr, "   ceiling %.0f rows/s, tidemark %s (%.0f rows/s)\n", r.ceiling.rate(), r.took.Round(time.Millisecond), float64(rows)/r.took.Seconds())
			if i == 1 {
				out, err := runChild(par, source, "verify", "--examples", "2")
				v, err := verdictOf(fmt.Sprintf("the copy at parallelism %d", par), out, err)
				if err != nil {
					return nil, err
				}
				verdict[par] = firstLine(v)
			}
			runs[par] = append(runs[par], r)
			if err := resetTargets(ctx, pg, "snappar_"); err != nil {
				return nil, err
			}
		}
	}
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "snapshot.parallelism\ttidemark time (median of %d)\trows/s\tCOPY ceiling rows/s (median)\tsnapshot ÷ ceiling per run\tmedian\tload after each run\ttidemark verify (run 1)\n", o.runs)
	for _, par := range snapParLevels {
		var took, ceil, ratio []float64
		var per, loads []string
		for _, r := range runs[par] {
			took = append(took, r.took.Seconds())
			ceil = append(ceil, r.ceiling.rate())
			x := (float64(rows) / r.took.Seconds()) / r.ceiling.rate()
			ratio = append(ratio, x)
			ratios[par] = append(ratios[par], x)
			per = append(per, fmt.Sprintf("%.2f", x))
			loads = append(loads, strings.Fields(r.load)[0])
		}
		fmt.Fprintf(tw, "%d\t%s\t%.0f\t%.0f\t%s\t%.2f\t%s\t%s\n", par, time.Duration(medianOf(took)*float64(time.Second)).Round(time.Millisecond),
			float64(rows)/medianOf(took), medianOf(ceil), strings.Join(per, " "), medianOf(ratio), strings.Join(loads, " "), verdict[par])
	}
	tw.Flush()
	fmt.Print(b.String())
	if o.out == "" {
		return ratios, nil
	}
	return ratios, replaceSection(o.out, "snapshot-parallel", fmt.Sprintf("## Parallel snapshot: first-run snapshot ÷ one COPY stream (`make bench-snapshot`, %s)\n\n%d-row peers table (as in `make bench-peers`), `tidemark catchup` without a checkpoint (the first-run snapshot of `tidemark run`) at each `snapshot.parallelism`, each right after the COPY ceiling (one pgx CopyFrom of rows of the same shape into a fresh table) measured in the same run, each after a CHECKPOINT with no autovacuum worker running; runs interleave the parallelisms. %s\n\n```\n%s```\n",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), rows, machine(), b.String()))
}

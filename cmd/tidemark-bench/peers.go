package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/go-mysql-org/go-mysql/client"

	"tidemark"
	"tidemark/integration/harness"
)

const peersDB = "tidemark_bench_peers"

// The peers' table: what the seeds' incident table looked like. DATETIME is
// written in Asia/Kolkata (the session zone), TIMESTAMP defaults to the
// source clock.
const peersDDL = `CREATE TABLE %s (
	id BIGINT NOT NULL PRIMARY KEY,
	amount DECIMAL(12,2) NOT NULL,
	name VARCHAR(64) NOT NULL,
	created_at DATETIME(6) NOT NULL,
	updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
	doc JSON
) DEFAULT CHARSET=utf8mb4`

// pgloader's load command. pgloader 3.6 turns MariaDB's
// DEFAULT current_timestamp(6) into the string literal
// 'current_timestamp(6)', which PostgreSQL refuses: the CAST rule drops the
// default. The zone clauses are the workaround for DATETIME (withZone).
const pgloaderLoad = `LOAD DATABASE
  FROM mysql://%s:%s@%s/%s
  INTO postgresql://%s:%s@%s/%s
WITH include drop, create tables, create indexes, reset sequences
%sCAST type timestamp to timestamptz drop default
ALTER SCHEMA '%s' RENAME TO '%s';
`

// peerRun is one back-to-back run of the two loaders.
type peerRun struct {
	pgloader, tidemark       time.Duration
	chameleon                time.Duration // pg_chameleon init_replica
	pgloaderRSS, tidemarkRSS int64         // KiB, VmHWM
	chameleonRSS             int64         // KiB, peak summed VmRSS of its process tree
	pgloaderVerify           string
	tidemarkVerify           string
	chameleonVerify          string
	ceiling                  result // the COPY ceiling, measured right before tidemark
}

// peersSummary is what the Targets table of issue 25 takes from
// benchPeers: per-run ratios (medians are taken by the reader) and peaks.
type peersSummary struct {
	rows                      int
	pgloader, chameleon, ceil []float64 // pgloader ÷ tidemark, init_replica ÷ tidemark, snapshot ÷ COPY ceiling
	drain                     []float64 // tidemark ÷ start_replica, per drain run
	tidemarkRSS, pgloaderRSS  int64     // KiB, largest VmHWM of all runs
	chameleonRSS              int64     // KiB, largest peak of its process tree
	tidemarkVerify            string    // first line of run 1's verdict
}

// benchPeers loads the same table with pgloader and with tidemark's
// first-run snapshot (`tidemark catchup` without a checkpoint: what `tidemark
// run` does first), back to back, runs times, and checks both copies with
// `tidemark verify`. The COPY ceiling (one pgx CopyFrom of rows of the same
// shape) is measured in each run, right before tidemark. Then the
// streaming drain, o.drainRuns times (none at 0).
func benchPeers(ctx context.Context, o options) (peersSummary, error) {
	var sum peersSummary
	if _, err := exec.LookPath("pgloader"); err != nil {
		return sum, errors.New("pgloader not found: `make bench-peers` installs it (apt-get install pgloader)")
	}
	sv, err := connect(ctx)
	if err != nil {
		return sum, err
	}
	defer sv.close(ctx)
	env, my, pg := sv.env, sv.my, sv.pg
	cleanup, err := buildTidemark(&o)
	if err != nil {
		return sum, err
	}
	defer cleanup()
	rows := o.peerRows
	sum.rows = rows
	if err := loadPeersTable(my, rows); err != nil {
		return sum, err
	}
	if err := resetTargets(ctx, pg, "peers_"); err != nil {
		return sum, err
	}

	dsn, err := url.Parse(env.PGDSN)
	if err != nil {
		return sum, fmt.Errorf("parse TIDEMARK_TEST_PG_DSN: %w", err)
	}
	pgPass, _ := dsn.User.Password()
	loadFile := func(schema, extra string) (string, error) {
		f, err := os.CreateTemp("", "tidemark-bench-*.load")
		if err != nil {
			return "", err
		}
		defer f.Close()
		_, err = fmt.Fprintf(f, pgloaderLoad, url.PathEscape(env.MySQLUser), url.PathEscape(env.MySQLPassword), env.MySQLAddr, peersDB,
			url.PathEscape(dsn.User.Username()), url.PathEscape(pgPass), dsn.Host, strings.TrimPrefix(dsn.Path, "/"), extra, peersDB, schema)
		return f.Name(), err
	}
	runPgloader := func(schema, extra string) (time.Duration, int64, error) {
		lf, err := loadFile(schema, extra)
		if err != nil {
			return 0, 0, err
		}
		defer os.Remove(lf)
		var out bytes.Buffer
		cmd := exec.Command("pgloader", lf)
		cmd.Stdout, cmd.Stderr = &out, &out
		took, rss, err := timeChild(cmd)
		if err != nil || regexp.MustCompile(`(?m)\b(ERROR|FATAL)\b`).Match(out.Bytes()) {
			return 0, 0, fmt.Errorf("pgloader into %s: %v\n%s", schema, err, out.String())
		}
		return took, rss, nil
	}
	runTidemark := func(source string) (time.Duration, int64, error) {
		cfg, err := writeConfigDB(env, source, peersDB, "t", tidemark.Position{})
		if err != nil {
			return 0, 0, err
		}
		defer os.Remove(cfg)
		var out bytes.Buffer
		cmd := tidemarkExec(env, o.bin, "catchup", "--config", cfg)
		cmd.Stdout, cmd.Stderr = &out, &out
		took, rss, err := timeChild(cmd)
		if err != nil {
			return 0, 0, fmt.Errorf("tidemark catchup: %v\n%s", err, out.String())
		}
		return took, rss, nil
	}
	verify := func(source string) (string, error) {
		cfg, err := writeConfigDB(env, source, peersDB, "t", tidemark.Position{})
		if err != nil {
			return "", err
		}
		defer os.Remove(cfg)
		cmd := tidemarkExec(env, o.bin, "verify", "--config", cfg, "--examples", "2")
		out, err := cmd.Output()
		return verdictOf(source, out, err)
	}

	var runs []peerRun
	for i := 1; i <= o.runs; i++ {
		var r peerRun
		pgSchema, tmSource := fmt.Sprintf("peers_pgloader_%d", i), fmt.Sprintf("peers_tidemark_%d", i)
		fmt.Fprintf(os.Stderr, "== [%d] pgloader\n", i)
		if err := quiescePG(ctx, pg, "peers_"); err != nil {
			return sum, err
		}
		if r.pgloader, r.pgloaderRSS, err = runPgloader(pgSchema, ""); err != nil {
			return sum, err
		}
		chSchema := fmt.Sprintf("peers_chameleon_%d", i)
		fmt.Fprintf(os.Stderr, "== [%d] pg_chameleon init_replica\n", i)
		ch, err := newChameleon(env, chSchema)
		if err != nil {
			return sum, err
		}
		if err := quiescePG(ctx, pg, "peers_"); err != nil {
			return sum, err
		}
		if r.chameleon, r.chameleonRSS, err = ch.initReplica(); err != nil {
			return sum, err
		}
		// The ceiling of this run, right before tidemark's load: a ratio
		// of two figures measured under the same load.
		fmt.Fprintf(os.Stderr, "== [%d] C COPY ceiling (one pgx CopyFrom of rows of the same shape)\n", i)
		if _, err := pg.Exec(ctx, "DROP SCHEMA IF EXISTS peers_ceiling CASCADE"); err != nil {
			return sum, err
		}
		if err := quiescePG(ctx, pg, "peers_"); err != nil {
			return sum, err
		}
		if r.ceiling, err = copyCeiling(ctx, pg, "peers_ceiling", rows); err != nil {
			return sum, err
		}
		fmt.Fprintf(os.Stderr, "== [%d] tidemark first-run snapshot (tidemark catchup, no checkpoint)\n", i)
		if err := quiescePG(ctx, pg, "peers_"); err != nil {
			return sum, err
		}
		if r.tidemark, r.tidemarkRSS, err = runTidemark(tmSource); err != nil {
			return sum, err
		}
		fmt.Fprintf(os.Stderr, "   pgloader %s, pg_chameleon %s, tidemark %s\n", r.pgloader.Round(time.Millisecond), r.chameleon.Round(time.Millisecond), r.tidemark.Round(time.Millisecond))
		if i == 1 {
			// Every run loads the same table the same way: the copies
			// of the first run are the ones checked.
			fmt.Fprintf(os.Stderr, "== [%d] tidemark verify of both copies\n", i)
			if r.pgloaderVerify, err = verify(pgSchema); err != nil {
				return sum, err
			}
			if r.tidemarkVerify, err = verify(tmSource); err != nil {
				return sum, err
			}
			if r.chameleonVerify, err = verify(chSchema); err != nil {
				return sum, err
			}
		}
		runs = append(runs, r)
		// Keep the disk bounded: this run's copies are checked.
		if err := resetTargets(ctx, pg, "peers_", "peers_ceiling"); err != nil {
			return sum, err
		}
	}
	fmt.Fprintln(os.Stderr, "== pgloader with the zone workaround (session zones set to the source zone), once")
	zoneFix := fmt.Sprintf("SET PostgreSQL PARAMETERS timezone = '%s'\nSET MySQL PARAMETERS time_zone = '\"%s\"'\n", zone, zone)
	fixTook, _, err := runPgloader("peers_pgloader_zonefix", zoneFix)
	if err != nil {
		return sum, err
	}
	fixVerify, err := verify("peers_pgloader_zonefix")
	if err != nil {
		return sum, err
	}
	var drains []drainResult
	for i := 1; i <= o.drainRuns; i++ {
		dr, err := drainPeers(ctx, sv, o.bin, i, i == 1, runTidemark, verify)
		if err != nil {
			return sum, err
		}
		drains = append(drains, dr)
		if err := resetTargets(ctx, pg, "peers_", "peers_pgloader_zonefix"); err != nil {
			return sum, err
		}
	}
	var docType string
	if err := pg.QueryRow(ctx, `SELECT format_type(atttypid, atttypmod) FROM pg_attribute
		WHERE attrelid = 'peers_pgloader_zonefix.t'::regclass AND attname = 'doc'`).Scan(&docType); err != nil {
		return sum, err
	}

	var pgl, tm, chm, ceils []float64
	var perRatio, perCh, perCeil []string
	for _, r := range runs {
		pgl = append(pgl, r.pgloader.Seconds())
		tm = append(tm, r.tidemark.Seconds())
		x := r.pgloader.Seconds() / r.tidemark.Seconds()
		sum.pgloader = append(sum.pgloader, x)
		perRatio = append(perRatio, fmt.Sprintf("%.2f×", x))
		chm = append(chm, r.chameleon.Seconds())
		y := r.chameleon.Seconds() / r.tidemark.Seconds()
		sum.chameleon = append(sum.chameleon, y)
		perCh = append(perCh, fmt.Sprintf("%.2f×", y))
		c := (float64(rows) / r.tidemark.Seconds()) / r.ceiling.rate()
		ceils = append(ceils, r.ceiling.took.Seconds())
		sum.ceil = append(sum.ceil, c)
		perCeil = append(perCeil, fmt.Sprintf("%.2f", c))
		sum.tidemarkRSS = max(sum.tidemarkRSS, r.tidemarkRSS)
		sum.pgloaderRSS = max(sum.pgloaderRSS, r.pgloaderRSS)
		sum.chameleonRSS = max(sum.chameleonRSS, r.chameleonRSS)
	}
	sum.tidemarkVerify = firstLine(runs[0].tidemarkVerify)
	var perDrain []string
	for _, dr := range drains {
		x := dr.chameleon.Seconds() / dr.tidemark.Seconds()
		sum.drain = append(sum.drain, x)
		perDrain = append(perDrain, fmt.Sprintf("%.1f×", x))
	}
	mib := func(kib int64) string { return fmt.Sprintf("%.0f MiB", float64(kib)/1024) }
	sec := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)).Round(time.Millisecond) }
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "loader (median of %d runs, back to back)\ttime\trows/s\tpeak RSS (largest run)\ttidemark verify (run 1)\n", len(runs))
	fmt.Fprintf(tw, "pgloader %s\t%s\t%.0f\t%s VmHWM\t%s\n", pgloaderVersion(), sec(medianOf(pgl)), float64(rows)/medianOf(pgl), mib(sum.pgloaderRSS), firstLine(runs[0].pgloaderVerify))
	fmt.Fprintf(tw, "pg_chameleon %s init_replica\t%s\t%.0f\t%s Σ VmRSS of its processes\t%s\n", chameleonVersion(), sec(medianOf(chm)), float64(rows)/medianOf(chm), mib(sum.chameleonRSS), firstLine(runs[0].chameleonVerify))
	fmt.Fprintf(tw, "tidemark first-run snapshot\t%s\t%.0f\t%s VmHWM\t%s\n", sec(medianOf(tm)), float64(rows)/medianOf(tm), mib(sum.tidemarkRSS), sum.tidemarkVerify)
	fmt.Fprintf(tw, "pgloader + zone workaround (once)\t%s\t%.0f\t\t%s\n", fixTook.Round(time.Millisecond), float64(rows)/fixTook.Seconds(), firstLine(fixVerify))
	fmt.Fprintf(tw, "C COPY ceiling (pgx CopyFrom), each run before tidemark\t%s\t%.0f\t\t\n", sec(medianOf(ceils)), float64(rows)/medianOf(ceils))
	tw.Flush()
	b.WriteString("\n")
	tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ratio\tper run\tmedian\ttarget\t")
	fmt.Fprintf(tw, "tidemark vs pgloader (pgloader time ÷ tidemark time)\t%s\t%.2f×\t≥ 2×\t%s\n", strings.Join(perRatio, " "), medianOf(sum.pgloader), pass(medianOf(sum.pgloader) >= 2))
	fmt.Fprintf(tw, "tidemark vs pg_chameleon init_replica (its time ÷ tidemark time)\t%s\t%.2f×\t≥ 2×\t%s\n", strings.Join(perCh, " "), medianOf(sum.chameleon), pass(medianOf(sum.chameleon) >= 2))
	if len(drains) > 0 {
		fmt.Fprintf(tw, "streaming drain of the same backlog, tidemark ÷ pg_chameleon start_replica\t%s\t%.1f×\t≥ 10×\t%s\n", strings.Join(perDrain, " "), medianOf(sum.drain), pass(medianOf(sum.drain) >= 10))
	}
	fmt.Fprintf(tw, "snapshot rows/s ÷ COPY ceiling rows/s\t%s\t%.2f\t≥ 1.2\t%s\n", strings.Join(perCeil, " "), medianOf(sum.ceil), pass(medianOf(sum.ceil) >= 1.2))
	fmt.Fprintf(tw, "peak RSS of tidemark (largest run)\t\t%s\t≤ 256 MiB\t%s\n", mib(sum.tidemarkRSS), pass(sum.tidemarkRSS <= 256*1024))
	tw.Flush()
	if len(drains) > 0 {
		b.WriteString("\n")
		tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "streaming drain (%d runs): %d changes after the initial copy\ttime (median)\tchanges/s\ttidemark verify (run 1)\n", len(drains), drains[0].changes)
		var cht, tmt []float64
		for _, dr := range drains {
			cht, tmt = append(cht, dr.chameleon.Seconds()), append(tmt, dr.tidemark.Seconds())
		}
		fmt.Fprintf(tw, "pg_chameleon start_replica\t%s\t%.0f\t%s\n", sec(medianOf(cht)), float64(drains[0].changes)/medianOf(cht), firstLine(drains[0].chameleonVerify))
		fmt.Fprintf(tw, "tidemark run\t%s\t%.0f\t%s\n", sec(medianOf(tmt)), float64(drains[0].changes)/medianOf(tmt), firstLine(drains[0].tidemarkVerify))
		tw.Flush()
	}
	b.WriteString("\nWhat tidemark verify found in pgloader's copy (run 1, default zone handling):\n")
	b.WriteString(indent(runs[0].pgloaderVerify))
	b.WriteString("What tidemark verify found in pg_chameleon's copy (run 1, out of the box):\n")
	b.WriteString(indent(runs[0].chameleonVerify))
	if len(drains) > 0 {
		b.WriteString("What tidemark verify found in pg_chameleon's copy after start_replica (the drain):\n")
		b.WriteString(indent(drains[0].chameleonVerify))
	}
	fmt.Fprintf(&b, "pgloader's copy, column doc (MariaDB JSON): PostgreSQL type %s\n", docType)
	fmt.Print(b.String())
	if o.out == "" {
		return sum, nil
	}
	drainNote := fmt.Sprintf(" Then, %d times: pg_chameleon's `start_replica` and `tidemark run` drain the same backlog of changes written after their initial copies, each from the same quiet PostgreSQL (run 1's copies checked with `tidemark verify`).", o.drainRuns)
	if o.drainRuns == 0 {
		drainNote = " No streaming drain in this run."
	}
	section := "peers"
	if rows != 1000000 {
		section = fmt.Sprintf("peers-%d", rows)
	}
	return sum, replaceSection(o.out, section, fmt.Sprintf("## Peers: pgloader and pg_chameleon versus tidemark's first-run snapshot, %d rows (`make bench-peers`, %s)\n\n%d-row table (BIGINT PK, DECIMAL(12,2), VARCHAR(64) with some non-ASCII names, DATETIME(6) written in %s, TIMESTAMP(6) DEFAULT CURRENT_TIMESTAMP(6), JSON), loaded by each tool into its own PostgreSQL schema, back to back in each run (pg_chameleon 2.0 from PyPI in a venv under .data/, its `init_replica`), each after the same quiet point (the earlier loads' tables out of autovacuum, a CHECKPOINT, no autovacuum worker running); the copies of run 1 checked with `tidemark verify`. Peak RSS: VmHWM of pgloader and of tidemark; for pg_chameleon (runuser, then python) the largest sum of VmRSS over its process tree, sampled every 50 ms.%s %s\n\n```\n%s```\n",
		rows, time.Now().UTC().Format("2006-01-02 15:04 UTC"), rows, zone, drainNote, machine(), b.String()))
}

// loadPeersTable creates peersDB.t with rows rows (the peers' table).
func loadPeersTable(my *client.Conn, rows int) error {
	return loadTable(my, peersDB, "t", rows)
}

// loadTable creates the database db afresh with a table of the peers'
// shape of rows rows.
func loadTable(my *client.Conn, db, table string, rows int) error {
	fmt.Fprintf(os.Stderr, "== loading %d rows into %s.%s\n", rows, db, table)
	t0 := time.Now()
	q := "`" + table + "`"
	if err := harness.Exec(my, "DROP DATABASE IF EXISTS "+db, "CREATE DATABASE "+db, "USE "+db, fmt.Sprintf(peersDDL, q),
		"SET time_zone = '"+zone+"'"); err != nil {
		return err
	}
	for lo := 0; lo < rows; lo += 100000 {
		n := min(100000, rows-lo)
		if err := harness.Exec(my, fmt.Sprintf(`INSERT INTO %s (id, amount, name, created_at, doc)
			SELECT %d + seq, (seq %% 1000000) / 100, CONCAT('name-', seq, IF(seq %% 7 = 0, '-é✓', '')),
				NOW(6) - INTERVAL (%d + seq) SECOND,
				CONCAT('{"k": ', seq, ', "tags": ["a", "b"], "price": ', seq %% 1000, '.50}')
			FROM seq_1_to_%d`, q, lo, lo, n)); err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "   loaded in %s\n", time.Since(t0).Round(time.Millisecond))
	return nil
}

// timeChild runs a command to its end and returns its wall-clock time and
// peak RSS (VmHWM, KiB).
func timeChild(cmd *exec.Cmd) (time.Duration, int64, error) {
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, 0, err
	}
	w := watchRSS(cmd.Process.Pid)
	err := cmd.Wait()
	return time.Since(start), w.Peak(), err
}

// exitDifferent is tidemark verify's exit code for "tables differ".
const exitDifferent = 1

// verdictOf reads the end of a `tidemark verify` of what: "EQUAL", or
// "DIFFERENT:" and its report, or an error when verify itself failed.
func verdictOf(what string, out []byte, err error) (string, error) {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return "EQUAL", nil
	case errors.As(err, &ee) && ee.ExitCode() == exitDifferent:
		return "DIFFERENT:\n" + string(out), nil
	default:
		return "", fmt.Errorf("tidemark verify of %s: %v\n%s", what, err, out)
	}
}

func pgloaderVersion() string {
	out, err := exec.Command("pgloader", "--version").Output()
	if err != nil {
		return "?"
	}
	if m := regexp.MustCompile(`version "([^"]+)"`).FindSubmatch(out); m != nil {
		return string(m[1])
	}
	return "?"
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return strings.TrimSuffix(l, ":")
}

func indent(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		b.WriteString("  " + l + "\n")
	}
	return b.String()
}

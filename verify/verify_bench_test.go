package verify

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"testing"
	"time"

	"tidemark"
	"tidemark/binlog"
	"tidemark/checkpoint"
	"tidemark/integration/harness"
	"tidemark/internal/testenv"
	"tidemark/sink/postgres"
)

// BenchmarkVerify compares the verify engine as `tidemark verify` runs it
// (opening both sides, checksums inside both
// databases, chunks of 10000 rows) with the test harness's whole-table Go
// comparison (harness.Compare reads every row of both sides) on the same
// equal table of TIDEMARK_BENCH_ROWS rows (default 200000):
//
//	go test -run '^$' -bench BenchmarkVerify -benchtime 1x ./verify
//
// Both report rows/s; their ratio is the speed-up, measured in one run.
func BenchmarkVerify(b *testing.B) {
	n := 200000
	if s := os.Getenv("TIDEMARK_BENCH_ROWS"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	env, err := harness.EnvFromOS()
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	my, err := env.MySQL()
	if err != nil {
		b.Fatal(err)
	}
	defer my.Close()
	pg, err := env.PG(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer pg.Close(ctx)
	db, control := testenv.Name("vb_"), testenv.Name("vbc_")
	defer my.Execute("DROP DATABASE IF EXISTS " + db)
	defer pg.Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+db+`" CASCADE`)
	defer pg.Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+control+`" CASCADE`)
	for _, q := range []string{
		"CREATE DATABASE " + db, "USE " + db,
		"CREATE TABLE t (id BIGINT PRIMARY KEY, customer VARCHAR(64) NOT NULL, amount DECIMAL(12,2) NOT NULL, note TEXT, updated_at DATETIME(6) NOT NULL)",
		fmt.Sprintf("INSERT INTO t SELECT seq, CONCAT('cust-', seq), (seq %% 100000) / 100, MD5(seq), '2026-01-01' + INTERVAL seq SECOND FROM seq_1_to_%d", n),
	} {
		if _, err := my.Execute(q); err != nil {
			b.Fatalf("source: %s: %v", q, err)
		}
	}
	for _, q := range []string{
		`CREATE SCHEMA "` + db + `"`,
		`CREATE TABLE "` + db + `".t (id bigint PRIMARY KEY, customer text NOT NULL, amount numeric(12,2) NOT NULL, note text, updated_at timestamptz NOT NULL,
			_tm_seq bigint NOT NULL, _tm_idx integer NOT NULL, _tm_commit_time timestamptz, _tm_loaded_at timestamptz NOT NULL DEFAULT now())`,
		fmt.Sprintf(`INSERT INTO "`+db+`".t SELECT i, 'cust-' || i, (i %% 100000) / 100.0, md5(i::text), ('2026-01-01'::timestamp + i * interval '1 second') AT TIME ZONE 'Asia/Kolkata', 1, 1, NULL
			FROM generate_series(1, %d) i`, n),
		`ANALYZE "` + db + `".t`,
	} {
		if _, err := pg.Exec(ctx, q); err != nil {
			b.Fatalf("target: %s: %v", q, err)
		}
	}
	loc, err := time.LoadLocation("Asia/Kolkata")
	if err != nil {
		b.Fatal(err)
	}
	bc := binlog.Config{Name: "bench", Addr: env.MySQLAddr, User: env.MySQLUser, Password: env.MySQLPassword,
		ServerID: 7499, Zone: tidemark.ZonePolicy{Location: loc}, Include: []string{db + ".*"}}
	// What runVerify in cmd/tidemark does: open both sides, verify, close.
	run := func() (*Report, error) {
		src, err := binlog.NewVerifier(bc)
		if err != nil {
			return nil, err
		}
		defer src.Close()
		store, err := checkpoint.New(checkpoint.Config{Schema: control})
		if err != nil {
			return nil, err
		}
		sink, err := postgres.Open(ctx, postgres.Config{DSN: env.PGDSN, Checkpoints: store, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return nil, err
		}
		defer sink.Close()
		return Tables(ctx, src, postgres.NewVerifier(sink), Options{Source: bc.Name, Tables: []tidemark.TableID{{Database: db, Name: "t"}},
			Zone: func(tidemark.TableID, string) string { return "Asia/Kolkata" }})
	}
	b.Run("verify", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			rep, err := run()
			if err != nil || rep.ExitCode() != ExitEqual {
				b.Fatalf("verify: %v %+v", err, rep)
			}
		}
		b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "rows/s")
	})
	b.Run("harness-compare", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			d, err := harness.Compare(ctx, my, pg, harness.TableSpec{Database: db, Table: "t", SourceZone: "Asia/Kolkata"})
			if err != nil || !d.Equal() {
				b.Fatalf("compare: %v %v", err, d)
			}
		}
		b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "rows/s")
	})
}

package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"tidemark"
	"tidemark/status"
)

// TestStatusPageRender: the page at / (404 until set), with what the
// sources give, the counters of applied batches, the modes as the page
// names them, and the warnings logged (not the info lines).
func TestStatusPageRender(t *testing.T) {
	m := NewMetrics()
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	get := func(path string) (int, string) {
		t.Helper()
		r, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		return r.StatusCode, string(b)
	}
	if code, _ := get("/"); code != http.StatusNotFound {
		t.Fatalf("/ without a page: %d", code)
	}
	lag := 1.5
	src := status.Sources{
		Report: func(context.Context) (*status.Report, error) {
			return &status.Report{Source: "s1", Checkpoint: "gtid=0-1-9", Tables: []status.Table{
				{Table: "db.a", Mode: "streaming", LagSeconds: &lag},
				{Table: "db.b", Mode: "quarantined", Reason: "incompatible <schema>"},
				{Table: "db.c", Mode: "snapshotting"},
			}}, nil
		},
		LastVerify: func(context.Context) (tidemark.VerifyRun, bool, error) {
			return tidemark.VerifyRun{Source: "s1", Verdict: "different", Tables: 3, Differing: 1, FinishedAt: time.Unix(0, 0)}, true, nil
		},
	}
	src.Dedupe, src.OnVerify = m.EachDedupe, m.SetVerify
	page := status.NewPage(status.Identity{Name: "s1", Flavor: "mariadb", Addr: "db:3306", ServerID: 77}, src)
	m.SetStatusPage(page)
	log := slog.New(page.Tee(slog.NewTextHandler(io.Discard, nil))).With("component", "x")
	log.Info("not kept")
	log.Error("table quarantined", "table", "db.b", "err", errors.New("boom"))
	tbl := &tidemark.Table{ID: tidemark.TableID{Database: "db", Name: "a"}}
	page.OnApply(&tidemark.Batch{Changes: []tidemark.Change{{Table: tbl, CommitTime: time.Now()}}}, tidemark.ApplyStats{Inserted: 7, Updated: 2, Skipped: 1}, time.Millisecond)
	page.SetCatchUp(true)
	code, body := get("/")
	if code != http.StatusOK {
		t.Fatalf("status %d", code)
	}
	for _, want := range []string{
		`<meta http-equiv="refresh" content="5">`, `id="checkpoint">gtid=0-1-9<`, `id="applied-inserted">7<`, `id="applied-total"><b>10</b>`,
		`data-table="db.a"`, `data-mode="catch-up"`, `data-mode="quarantined"`, `incompatible &lt;schema&gt;`, `data-mode="snapshot"`,
		`id="verify-verdict">different<`, `id="verify-differing">1<`, `id="max-lag">1.5s<`, `table quarantined`, `component=x table=db.b err=boom`,
		`id="source-server-id">77<`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("page lacks %s", want)
		}
	}
	if strings.Contains(body, "not kept") || strings.Contains(body, "<script") || strings.Contains(body, "http://") || strings.Contains(body, "https://") {
		t.Errorf("page has an info line, a script or an external reference:\n%s", body)
	}
	// The verify metric follows the page's read.
	_, metrics := get("/metrics")
	if !strings.Contains(metrics, `tidemark_verify_tables{verdict="different"} 1`) {
		t.Errorf("metrics lack the verify run:\n%s", metrics)
	}
}

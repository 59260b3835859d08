package main

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"tidemark/internal/workload"
)

// TestDemo runs `tidemark demo` with a short workload on the local
// services: it replicates the backlog and the live phase, prints the
// verification (the verify package's report) and the IST row, and ends
// equal — from MariaDB and from the real MySQL 9.7 (make demo SOURCE=mysql).
func TestDemo(t *testing.T) {
	if _, err := workload.EnvFromOS(); err != nil {
		t.Fatal(err) // names the command that sets the environment
	}
	for _, flavor := range []string{"mariadb", "mysql"} {
		t.Run(flavor, func(t *testing.T) { testDemo(t, flavor) })
	}
}

func testDemo(t *testing.T, flavor string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out strings.Builder
	if err := demo(ctx, flavor, 40, "127.0.0.1:0", slog.New(slog.DiscardHandler), &out, io.Discard); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	for _, s := range []string{
		"phase 1: wrote a backlog of 41 transactions",
		"phase 2: streamed",
		"TABLE                 SOURCE ROWS",
		"verdict: EQUAL",
		"the IST case: source DATETIME updated_at = '2026-03-10 23:58:00.000000' (written in Asia/Kolkata) → target timestamptz = 2026-03-10T18:28:00Z",
		"verification: EQUAL — ",
	} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("demo output lacks %q:\n%s", s, out.String())
		}
	}
}

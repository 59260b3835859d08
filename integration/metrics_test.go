package integration

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// scrape returns the samples of /metrics whose name starts with prefix,
// keyed by the full sample name with labels.
func scrape(t *testing.T, url, prefix string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestMetricsMatchWorkload scrapes /metrics of the running daemon and
// checks the change counters against a known workload, and the health
// endpoints.
func TestMetricsMatchWorkload(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_metrics_")
	f.dropLater(t, db, db)
	start, _ := harness.SourcePosition(f.my)
	w := &harness.Workload{My: f.my, Database: db, Zone: "UTC", Rand: rand.New(rand.NewPCG(61, 62))}
	if err := w.Setup(); err != nil { // 2 inserts
		t.Fatal(err)
	}
	// A known workload: 300 inserts (3 transactions), 40 updates, 25 deletes.
	for i := 0; i < 3; i++ {
		if err := harness.Exec(f.my, fmt.Sprintf("INSERT INTO orders SELECT %d + seq, 1, 'm', 1.00, 'new', NULL, NOW(6), NULL FROM seq_1_to_100", 1000+i*100)); err != nil {
			t.Fatal(err)
		}
	}
	if err := harness.Exec(f.my, "UPDATE orders SET amount = 2.00 WHERE order_id BETWEEN 1001 AND 1040",
		"DELETE FROM orders WHERE order_id BETWEEN 1201 AND 1225"); err != nil {
		t.Fatal(err)
	}
	addr := freePort(t)
	cfg := f.configYAMLWith(t, db, db, db, "UTC", start, fmt.Sprintf("metrics:\n  listen: %s\ndedupe:\n  enabled: false\n", addr))
	d := f.startDaemon(t, cfg)
	defer d.stop(t)
	f.waitCaughtUp(t, db, d)
	base := "http://" + addr
	for _, path := range []string{"/healthz", "/readyz"} {
		deadline := time.Now().Add(10 * time.Second)
		for {
			resp, err := http.Get(base + path)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == 200 {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not 200 (%v)", path, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	table := db + ".orders"
	m := scrape(t, base+"/metrics", "tidemark_")
	got := func(op string) float64 {
		return m[fmt.Sprintf(`tidemark_changes_total{op="%s",table="%s"}`, op, table)]
	}
	if got("c") != 302 || got("u") != 40 || got("d") != 25 {
		t.Fatalf("changes c/u/d = %v/%v/%v, want 302/40/25; samples:\n%v", got("c"), got("u"), got("d"), m)
	}
	applied := m[`tidemark_apply_rows_total{result="inserted"}`] + m[`tidemark_apply_rows_total{result="updated"}`] +
		m[`tidemark_apply_rows_total{result="deleted"}`] + m[`tidemark_apply_rows_total{result="skipped"}`] + m[`tidemark_apply_rows_total{result="coalesced"}`]
	if applied != 367 {
		t.Fatalf("apply results sum to %v, want 367", applied)
	}
	if _, ok := m["tidemark_binlog_retention_headroom_seconds"]; !ok {
		t.Fatal("no retention headroom gauge")
	}
	// Direct inserts are a part of the inserts (which batches were all
	// inserts depends on timing).
	direct, ok := m["tidemark_direct_insert_rows_total"]
	if _, ok2 := m["tidemark_direct_insert_conflicts_total"]; !ok || !ok2 || direct > m[`tidemark_apply_rows_total{result="inserted"}`] {
		t.Fatalf("direct insert counters: rows %v (present %v), inserted %v", direct, ok, m[`tidemark_apply_rows_total{result="inserted"}`])
	}
}

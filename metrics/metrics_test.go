package metrics

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"tidemark"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestMetricsEndpoints(t *testing.T) {
	m := New()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var logs bytes.Buffer
	go func() { done <- m.ServeOn(ctx, ln, nil, slog.New(slog.NewTextHandler(&logs, nil))) }()
	base := "http://" + ln.Addr().String()

	if code, _ := get(t, base+"/healthz"); code != 200 {
		t.Fatalf("/healthz %d", code)
	}
	if code, _ := get(t, base+"/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz before any batch: %d", code)
	}
	orders := &tidemark.Table{ID: tidemark.TableID{Database: "shop", Name: "orders"}}
	items := &tidemark.Table{ID: tidemark.TableID{Database: "shop", Name: "items"}}
	commit := time.Now().Add(-3 * time.Second)
	b := &tidemark.Batch{Changes: []tidemark.Change{
		{Op: tidemark.OpInsert, Table: orders, CommitTime: commit, Size: 100},
		{Op: tidemark.OpInsert, Table: orders, CommitTime: commit, Size: 100},
		{Op: tidemark.OpDelete, Table: items, CommitTime: commit.Add(-time.Minute), Size: 50},
	}}
	m.OnApply(b, tidemark.ApplyStats{Inserted: 2, Deleted: 1}, 40*time.Millisecond)
	m.Error(fmt.Errorf("stream: %w", tidemark.ErrPositionPurged))
	m.Error(fmt.Errorf("assert: %w", tidemark.ErrDuplicateKeys))
	m.Error(errors.New("boom"))
	m.FallbackRun(map[string]int64{"shop.orders": 12})
	m.SetRetention(tidemark.Retention{Expire: 2 * time.Hour, Headroom: 90 * time.Minute})
	m.WatchDedupe(func(f func(string, uint64)) { f("seen", 5); f("dropped_duplicate", 2); f("keys", 3) })

	if code, _ := get(t, base+"/readyz"); code != 200 {
		t.Fatalf("/readyz after a batch: %d", code)
	}
	code, body := get(t, base+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics %d", code)
	}
	for _, want := range []string{
		`tidemark_changes_total{op="c",table="shop.orders"} 2`,
		`tidemark_changes_total{op="d",table="shop.items"} 1`,
		`tidemark_apply_rows_total{result="inserted"} 2`,
		`tidemark_apply_rows_total{result="skipped"} 0`,
		`tidemark_batch_changes_count 1`,
		`tidemark_batch_bytes_sum 250`,
		`tidemark_apply_seconds_sum 0.04`,
		`tidemark_errors_total{class="position_purged"} 1`,
		`tidemark_errors_total{class="duplicate_keys"} 1`,
		`tidemark_errors_total{class="other"} 1`,
		`tidemark_fallback_runs_total 1`,
		`tidemark_fallback_rows_total{table="shop.orders"} 12`,
		`tidemark_binlog_retention_headroom_seconds 5400`,
		`tidemark_dedupe_total{name="seen"} 5`,
		`tidemark_dedupe_keys 3`,
		`go_goroutines`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, `tidemark_lag_seconds{table="shop.orders"} `) {
			var v float64
			fmt.Sscan(strings.Fields(line)[1], &v)
			if v < 2.5 || v > 60 {
				t.Errorf("lag %v, want ≈3 s", v)
			}
		}
	}
	if !strings.Contains(body, `tidemark_lag_seconds{table="shop.items"} 6`) {
		t.Errorf("lag of items (commit a minute earlier) missing:\n%s", grep(body, "tidemark_lag"))
	}
	m.SetRetention(tidemark.Retention{Unbounded: true})
	if _, body = get(t, base+"/metrics"); !strings.Contains(body, "tidemark_binlog_retention_headroom_seconds +Inf") {
		t.Errorf("unbounded retention: %s", grep(body, "headroom"))
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}
	if strings.Contains(logs.String(), "no authentication") {
		t.Errorf("loopback listener warned: %s", logs.String())
	}
}

func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestErrorClass(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("x: %w", tidemark.ErrPositionAhead), "position_ahead"},
		{&tidemark.ValueError{Column: "c", Err: tidemark.ErrZeroDate}, "value"},
		{fmt.Errorf("x: %w", context.Canceled), "canceled"},
		{&tidemark.Retryable{Err: errors.New("reset")}, "transient"},
		{fmt.Errorf("x: %w", tidemark.ErrStatsMismatch), "stats_mismatch"},
	} {
		if got := errorClass(tc.err); got != tc.want {
			t.Errorf("%v: class %s, want %s", tc.err, got, tc.want)
		}
	}
}

func TestWatchRetention(t *testing.T) {
	m := New()
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	done := make(chan error, 1)
	go func() {
		done <- m.WatchRetention(ctx, 10*time.Millisecond, func(context.Context) (tidemark.Retention, error) {
			calls++
			if calls == 3 {
				cancel()
			}
			if calls == 2 {
				return tidemark.Retention{}, errors.New("source down")
			}
			return tidemark.Retention{Headroom: time.Duration(calls) * time.Hour}, nil
		}, slog.New(slog.DiscardHandler))
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if calls < 3 {
		t.Fatalf("%d probes", calls)
	}
}

func TestTableStateMetric(t *testing.T) {
	m := New()
	set := m.WatchTableStates()
	id := tidemark.TableID{Database: "shop", Name: "orders"}
	set(tidemark.TableState{Table: id, Mode: tidemark.TableQuarantined})
	set(tidemark.TableState{Table: id, Mode: tidemark.TableStreaming})
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != "tidemark_table_state" {
			continue
		}
		for _, mt := range f.GetMetric() {
			var state string
			for _, l := range mt.GetLabel() {
				if l.GetName() == "state" {
					state = l.GetValue()
				}
			}
			got[state] = mt.GetGauge().GetValue()
		}
	}
	if got["streaming"] != 1 || got["quarantined"] != 0 || len(got) != 4 {
		t.Fatalf("tidemark_table_state %v", got)
	}
}

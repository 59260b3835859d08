package binlog

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestSQLConns: against the real server, a shared sqlConns runs every
// statement in one session (set up once, still used after ctx is done,
// replaced after a failed statement or when the server killed it); a pooled
// one gives concurrent statements their own sessions, reuses idle ones, and
// refuses to start a statement once ctx is done.
func TestSQLConns(t *testing.T) {
	cfg, c := verifyTestServer(t)
	cfg.QueryTimeout = 30 * time.Second
	ctx := context.Background()
	id := func(p *sqlConns, ctx context.Context) (uint64, string) {
		t.Helper()
		r, err := p.exec(ctx, "SELECT CONNECTION_ID(), @@session.time_zone")
		if err != nil {
			t.Fatal(err)
		}
		n, _ := r.GetUint(0, 0)
		tz, _ := r.GetString(0, 1)
		return n, tz
	}

	shared := &sqlConns{cfg: &cfg, setup: []string{"SET time_zone = '+00:00'"}, purpose: "test session", shared: true}
	defer shared.close()
	first, tz := id(shared, ctx)
	if tz != "+00:00" {
		t.Fatalf("session time zone %q: setup not run", tz)
	}
	if _, err := shared.exec(ctx, "SET @held = 42"); err != nil {
		t.Fatal(err)
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	r, err := shared.exec(done, "SELECT @held")
	if err != nil {
		t.Fatalf("shared session after ctx is done: %v", err)
	}
	if v, _ := r.GetInt(0, 0); v != 42 {
		t.Fatalf("a later statement ran in another session (@held = %d)", v)
	}
	if _, err := shared.exec(ctx, "SELECT no_such_column"); err == nil {
		t.Fatal("bad statement succeeded")
	}
	second, _ := id(shared, ctx)
	if second == first {
		t.Fatal("the session survived a failed statement")
	}
	if _, err := c.Execute("KILL " + strconv.FormatUint(second, 10)); err != nil {
		t.Fatal(err)
	}
	if third, tz := id(shared, ctx); third == second || tz != "+00:00" {
		t.Fatalf("after KILL: session %d (was %d), time zone %q", third, second, tz)
	}

	pooled := &sqlConns{cfg: &cfg, setup: []string{"SET time_zone = '+00:00'"}, purpose: "test session"}
	defer pooled.close()
	a, _ := id(pooled, ctx)
	if b, _ := id(pooled, ctx); b != a {
		t.Fatalf("an idle session was not reused: %d then %d", a, b)
	}
	var wg sync.WaitGroup
	ids := make([]uint64, 2)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := pooled.exec(ctx, "SELECT CONNECTION_ID(), SLEEP(0.3)")
			if err != nil {
				t.Error(err)
				return
			}
			ids[i], _ = r.GetUint(0, 0)
		}()
	}
	wg.Wait()
	if ids[0] == ids[1] {
		t.Fatalf("concurrent statements shared session %d", ids[0])
	}
	if _, err := pooled.exec(done, "SELECT 1"); err == nil || !strings.Contains(err.Error(), "canceled") {
		t.Fatalf("pooled statement after ctx is done: %v", err)
	}
}

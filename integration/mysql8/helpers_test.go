// Package mysql8 runs tidemark's real binlog tailer (and the daemon) against
// the protocol-level MySQL 8 primary of integration/mysqlprimary: no MySQL
// server is installed, the primary is in process.
package mysql8

import (
	"context"
	"testing"
	"time"

	"tidemark"
	"tidemark/binlog"
	"tidemark/integration/mysqlprimary"
)

const (
	uuidA = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
	uuidB = "7c9a4b21-0d3e-11ef-8a51-0242ac120002"
)

func startPrimary(t *testing.T, cfg mysqlprimary.Config) *mysqlprimary.Primary {
	t.Helper()
	if cfg.Password == "" {
		cfg.Password = "s3cret-pw"
	}
	p, err := mysqlprimary.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func newTailer(t *testing.T, p *mysqlprimary.Primary, mod func(*binlog.Config)) *binlog.Tailer {
	t.Helper()
	cfg := binlog.Config{
		Name: "my8", Flavor: binlog.FlavorMySQL, Addr: p.Addr(), User: "tidemark", Password: "s3cret-pw",
		ServerID: 4242, Heartbeat: 200 * time.Millisecond, Backoff: tidemark.Backoff{Attempts: 2, Initial: 10 * time.Millisecond},
	}
	if mod != nil {
		mod(&cfg)
	}
	tl, err := binlog.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tl
}

// stream runs the tailer until commits transactions arrived, the stream
// ends, or 20 s pass; it returns the changes, the commit positions and the
// stream's error (nil if it was still running).
func stream(t *testing.T, tl *binlog.Tailer, from tidemark.Position, commits int) ([]tidemark.Change, []tidemark.Position, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out := make(chan tidemark.Chunk, 16)
	errc := make(chan error, 1)
	go func() { errc <- tl.Stream(ctx, from, out) }()
	var changes []tidemark.Change
	var positions []tidemark.Position
	for len(positions) < commits {
		select {
		case ch := <-out:
			changes = append(changes, ch.Changes...)
			if !ch.Commit.IsZero() {
				positions = append(positions, ch.Commit)
			}
		case err := <-errc:
			return changes, positions, err
		case <-ctx.Done():
			t.Fatalf("timed out with %d of %d commits", len(positions), commits)
		}
	}
	cancel()
	<-errc
	return changes, positions, nil
}

var (
	itemsTable = &mysqlprimary.Table{ID: 101, Schema: "shop", Name: "items", Key: []int{0}, Columns: []mysqlprimary.Column{
		{Name: "id", Type: mysqlprimary.TypeLongLong},
		{Name: "name", Type: mysqlprimary.TypeVarchar, Meta: 1020, Nullable: true},
		{Name: "doc", Type: mysqlprimary.TypeJSON, Nullable: true},
	}}
)

func ins(id int64, name string) mysqlprimary.Row {
	return mysqlprimary.Row{Op: mysqlprimary.Insert, Table: itemsTable, After: []any{id, name, nil}}
}

package harness

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-mysql-org/go-mysql/client"
	"github.com/jackc/pgx/v5"

	"tidemark"
	"tidemark/checkpoint"
	"tidemark/internal/workload"
)

// The demo's workload and the local services' settings live in
// internal/workload (the demo in the product binary uses them too); the
// names below keep the tests' spelling.

// Env is the connection settings of the local services.
type Env = workload.Env

// EnvFromOS reads the TIDEMARK_TEST_* variables; it fails when they are not
// set, naming the command that sets them.
func EnvFromOS() (Env, error) { return workload.EnvFromOS() }

// OrdersDDL creates the demo table.
const OrdersDDL = workload.OrdersDDL

// Exec runs statements on the source, stopping at the first error.
func Exec(my *client.Conn, sqls ...string) error { return workload.Exec(my, sqls...) }

// WorkloadStats counts what a workload did.
type WorkloadStats = workload.Stats

// Workload writes a mixed, reproducible workload into db.orders.
type Workload = workload.Workload

// SourcePosition returns the source's current GTID position.
func SourcePosition(my *client.Conn) (tidemark.Position, error) { return workload.SourcePosition(my) }

// StoredCheckpoint reads a source's checkpoint from the control table.
func StoredCheckpoint(ctx context.Context, pg *pgx.Conn, controlSchema, source string) (tidemark.Position, bool, error) {
	if controlSchema == "" {
		controlSchema = checkpoint.DefaultSchema
	}
	var s string
	err := pg.QueryRow(ctx, "SELECT position FROM "+quotePG(controlSchema)+".checkpoints WHERE source = $1", source).Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) {
		return tidemark.Position{}, false, nil
	}
	if err != nil {
		// The control table may not exist yet.
		if strings.Contains(err.Error(), "does not exist") {
			return tidemark.Position{}, false, nil
		}
		return tidemark.Position{}, false, err
	}
	p, err := tidemark.ParsePosition(s)
	return p, true, err
}

// Snapshotting returns the tables of source whose snapshot is requested or
// in progress (state resync or snapshotting), none when the control table
// does not exist.
func Snapshotting(ctx context.Context, pg *pgx.Conn, controlSchema, source string) ([]string, error) {
	if controlSchema == "" {
		controlSchema = "tidemark"
	}
	rows, err := pg.Query(ctx, "SELECT database || '.' || table_name FROM "+quotePG(controlSchema)+".tables WHERE source = $1 AND state IN ('resync', 'snapshotting') ORDER BY 1", source)
	if err != nil {
		if strings.Contains(err.Error(), "does not exist") {
			return nil, nil
		}
		return nil, err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil && strings.Contains(err.Error(), "does not exist") {
		return nil, nil
	}
	return names, err
}

// WaitCaughtUp polls the stored checkpoint until it reaches target and no
// table of the source is being snapshotted (a snapshot beside the stream
// goes on after the checkpoint has passed target).
func WaitCaughtUp(ctx context.Context, pg *pgx.Conn, controlSchema, source string, target tidemark.Position, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		p, ok, err := StoredCheckpoint(ctx, pg, controlSchema, source)
		if err != nil {
			return err
		}
		var snapping []string
		if ok {
			if c, err := (tidemark.Position{GTID: p.GTID}).Compare(target); err == nil && c >= 0 {
				if snapping, err = Snapshotting(ctx, pg, controlSchema, source); err != nil {
					return err
				}
				if len(snapping) == 0 {
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			if len(snapping) > 0 {
				return fmt.Errorf("checkpoint of %s reached %v, but after %s these tables are still being snapshotted: %s", source, target, timeout, strings.Join(snapping, ", "))
			}
			return fmt.Errorf("checkpoint of %s is %v after %s, want ≥ %v", source, p, timeout, target)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

package workload

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/go-mysql-org/go-mysql/client"
	"github.com/jackc/pgx/v5"

	"tidemark"
)

// Lab is a session on each of the local services, for the demo: it writes
// the workload into the source and prepares and reads the target, so that
// the demo's command holds no driver type.
type Lab struct {
	// Env is where the services are.
	Env Env
	my  *client.Conn
	pg  *pgx.Conn
}

// OpenLab connects to the source and the target of env.
func OpenLab(ctx context.Context, env Env) (*Lab, error) {
	my, err := env.MySQL()
	if err != nil {
		return nil, err
	}
	pg, err := env.PG(ctx)
	if err != nil {
		my.Close()
		return nil, err
	}
	return &Lab{Env: env, my: my, pg: pg}, nil
}

// Close closes both sessions.
func (l *Lab) Close(ctx context.Context) {
	l.my.Close()
	l.pg.Close(ctx)
}

// Source returns the session on the source, for the bench and the tests,
// which drive the servers directly.
func (l *Lab) Source() *client.Conn { return l.my }

// Target returns the session on the target, for the bench and the tests.
func (l *Lab) Target() *pgx.Conn { return l.pg }

// Position returns the source's current GTID position.
func (l *Lab) Position() (tidemark.Position, error) { return SourcePosition(l.my) }

// Workload returns a workload on the source into database (created by
// Setup) with the session in zone.
func (l *Lab) Workload(database, zone string, r *rand.Rand) *Workload {
	return &Workload{My: l.my, Database: database, Zone: zone, Rand: r}
}

// ResetTarget drops the target schema and the checkpoint of source in the
// control schema (when the control table exists): a clean slate.
func (l *Lab) ResetTarget(ctx context.Context, schema, controlSchema, source string) error {
	if _, err := l.pg.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
		return fmt.Errorf("drop target schema %s: %w", schema, err)
	}
	table := pgx.Identifier{controlSchema, "checkpoints"}.Sanitize()
	var exists bool
	if err := l.pg.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table).Scan(&exists); err != nil {
		return fmt.Errorf("find %s: %w", table, err)
	}
	if !exists {
		return nil
	}
	if _, err := l.pg.Exec(ctx, "DELETE FROM "+table+" WHERE source = $1", source); err != nil {
		return fmt.Errorf("reset checkpoint of %s: %w", source, err)
	}
	return nil
}

// Incident reads the IST incident row (Workload.Setup) on both sides:
// updated_at as the source stores it (wall-clock text in the source zone)
// and as the target stores it (an instant).
func (l *Lab) Incident(ctx context.Context, database, targetSchema string) (source string, target time.Time, err error) {
	r, err := l.my.Execute("SELECT CAST(updated_at AS CHAR) FROM " + tidemark.QuoteMySQL(database) + ".orders WHERE order_id = 0 AND line_item_id = 1")
	if err != nil {
		return "", time.Time{}, fmt.Errorf("read the IST row from the source: %w", err)
	}
	if r.RowNumber() == 1 {
		source, _ = r.GetString(0, 0)
	}
	q := "SELECT updated_at FROM " + pgx.Identifier{targetSchema, "orders"}.Sanitize() + " WHERE order_id = 0 AND line_item_id = 1"
	if err := l.pg.QueryRow(ctx, q).Scan(&target); err != nil {
		return "", time.Time{}, fmt.Errorf("read the IST row from the target: %w", err)
	}
	return source, target.UTC(), nil
}

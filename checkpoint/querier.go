package checkpoint

import (
	"context"
	"errors"
)

// Querier is the part of a database transaction that a Store needs. The
// PostgreSQL sink adapts its driver's transaction (or pool) to it, so that
// checkpoints commit with the data and no driver type crosses a package
// boundary.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) error
	QueryRow(ctx context.Context, sql string, args ...any) RowScanner
}

// RowScanner scans one result row; Scan returns ErrNoRows when there is none.
type RowScanner interface {
	Scan(dest ...any) error
}

// ErrNoRows is returned by a Querier's row when the query found nothing.
var ErrNoRows = errors.New("no rows")

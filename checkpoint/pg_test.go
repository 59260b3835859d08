package checkpoint_test

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"tidemark/checkpoint"
)

// adapter adapts a pgx connection or transaction to checkpoint.Querier, as
// the sinks do.
type adapter struct {
	exec  func(ctx context.Context, sql string, args ...any) error
	query func(ctx context.Context, sql string, args ...any) pgx.Row
}

func newQuerier(conn *pgx.Conn) checkpoint.Querier {
	return adapter{
		exec: func(ctx context.Context, sql string, args ...any) error {
			_, err := conn.Exec(ctx, sql, args...)
			return err
		},
		query: conn.QueryRow,
	}
}

func txQuerier(tx pgx.Tx) checkpoint.Querier {
	return adapter{
		exec: func(ctx context.Context, sql string, args ...any) error {
			_, err := tx.Exec(ctx, sql, args...)
			return err
		},
		query: tx.QueryRow,
	}
}

func (a adapter) Exec(ctx context.Context, sql string, args ...any) error {
	return a.exec(ctx, sql, args...)
}

func (a adapter) QueryRow(ctx context.Context, sql string, args ...any) checkpoint.RowScanner {
	return row{a.query(ctx, sql, args...)}
}

type row struct{ r pgx.Row }

func (r row) Scan(dest ...any) error {
	err := r.r.Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		return checkpoint.ErrNoRows
	}
	return err
}

package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"tidemark"
)

var _ tidemark.TableRegistry = (*Sink)(nil)

// TableStates implements tidemark.TableRegistry.
func (s *Sink) TableStates(ctx context.Context, source string) ([]tidemark.TableState, error) {
	var out []tidemark.TableState
	err := s.retry(ctx, "read table states", func(ctx context.Context) error {
		var err error
		out, err = s.cfg.Checkpoints.LoadTableStates(ctx, querier{s.pool}, source)
		return redact(err, s.secret)
	})
	return out, redact(err, s.secret)
}

// SetTableState implements tidemark.TableRegistry.
func (s *Sink) SetTableState(ctx context.Context, source string, st tidemark.TableState) error {
	err := s.retry(ctx, "record state of "+st.Table.String(), func(ctx context.Context) error {
		return redact(s.fencedExec(ctx, source, func(q querier) error {
			return s.cfg.Checkpoints.SaveTableState(ctx, q, source, st)
		}), s.secret)
	})
	return redact(err, s.secret)
}

// SwapTableState implements tidemark.TableRegistry. A retry after a
// connection lost during the statement may find the state it recorded and
// report false: callers read the state back.
func (s *Sink) SwapTableState(ctx context.Context, source string, old tidemark.TableMode, st tidemark.TableState) (bool, error) {
	var ok bool
	err := s.retry(ctx, "record state of "+st.Table.String(), func(ctx context.Context) error {
		return redact(s.fencedExec(ctx, source, func(q querier) error {
			var err error
			ok, err = s.cfg.Checkpoints.SwapTableState(ctx, q, source, old, st)
			return err
		}), s.secret)
	})
	return ok, redact(err, s.secret)
}

// HasTable implements tidemark.TableRegistry.
func (s *Sink) HasTable(ctx context.Context, id tidemark.TableID) (bool, error) {
	_, _, qname, err := s.targetOf(id)
	if err != nil {
		return false, err
	}
	var exists bool
	err = s.retry(ctx, "look up "+qname, func(ctx context.Context) error {
		return redact(s.pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", qname).Scan(&exists), s.secret)
	})
	return exists, redact(err, s.secret)
}

// ResetTable implements tidemark.TableRegistry: it drops the target table
// and forgets the table's watermark, in one transaction.
func (s *Sink) ResetTable(ctx context.Context, source string, id tidemark.TableID) error {
	_, _, qname, err := s.targetOf(id)
	if err != nil {
		return err
	}
	err = tidemark.Retry(ctx, "reset "+qname, s.cfg.Retry, retryable, s.rlog, func(ctx context.Context) error {
		return s.ddlTx(ctx, func(tx pgx.Tx) error {
			if err := s.fence(ctx, tx, source); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "DROP TABLE IF EXISTS "+qname); err != nil {
				return fmt.Errorf("drop %s: %w", qname, err)
			}
			return s.cfg.Checkpoints.DeleteWatermark(ctx, querier{tx}, source, id)
		})
	})
	s.forgetTable(id)
	return redact(err, s.secret)
}

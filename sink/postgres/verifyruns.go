package postgres

import (
	"context"
	"errors"
	"fmt"

	"tidemark"
)

func (s *Sink) verifyRunStore() (tidemark.VerifyRunStore, error) {
	st, ok := s.cfg.Checkpoints.(tidemark.VerifyRunStore)
	if !ok {
		return nil, fmt.Errorf("verify runs: the checkpoint store %T does not store them: %w", s.cfg.Checkpoints, errors.ErrUnsupported)
	}
	return st, nil
}

// RecordVerifyRun stores the outcome of a verification in the target's
// control tables (the daemon's status page and metrics read it back).
func (s *Sink) RecordVerifyRun(ctx context.Context, r tidemark.VerifyRun) error {
	store, err := s.verifyRunStore()
	if err != nil {
		return err
	}
	err = s.retry(ctx, "record verify run", func(ctx context.Context) error {
		return redact(store.SaveVerifyRun(ctx, querier{s.pool}, r), s.secret)
	})
	return redact(err, s.secret)
}

// LastVerifyRun returns the last verification recorded for source.
func (s *Sink) LastVerifyRun(ctx context.Context, source string) (tidemark.VerifyRun, bool, error) {
	store, err := s.verifyRunStore()
	if err != nil {
		return tidemark.VerifyRun{}, false, err
	}
	var r tidemark.VerifyRun
	var ok bool
	err = s.retry(ctx, "read the last verify run", func(ctx context.Context) error {
		var err error
		r, ok, err = store.LastVerifyRun(ctx, querier{s.pool}, source)
		return redact(err, s.secret)
	})
	return r, ok, redact(err, s.secret)
}

package postgres

import (
	"context"

	"tidemark"
)

// RecordVerifyRun stores the outcome of a verification in the target's
// control tables (the daemon's status page and metrics read it back).
func (s *Sink) RecordVerifyRun(ctx context.Context, r tidemark.VerifyRun) error {
	err := s.retry(ctx, "record verify run", func(ctx context.Context) error {
		return redact(s.cfg.Checkpoints.SaveVerifyRun(ctx, querier{s.pool}, r), s.secret)
	})
	return redact(err, s.secret)
}

// LastVerifyRun returns the last verification recorded for source.
func (s *Sink) LastVerifyRun(ctx context.Context, source string) (tidemark.VerifyRun, bool, error) {
	var r tidemark.VerifyRun
	var ok bool
	err := s.retry(ctx, "read the last verify run", func(ctx context.Context) error {
		var err error
		r, ok, err = s.cfg.Checkpoints.LastVerifyRun(ctx, querier{s.pool}, source)
		return redact(err, s.secret)
	})
	return r, ok, redact(err, s.secret)
}

package verify

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"tidemark"
)

// What the post-load assertion does with a violation (AssertConfig.OnViolation).
const (
	// AssertStop returns the violation: the pipeline stops with it.
	AssertStop = "stop"
	// AssertAlert logs the violation and counts it; the pipeline goes on.
	AssertAlert = "alert"
)

// DefaultAssertInterval is how often the assertion runs while streaming.
const DefaultAssertInterval = 5 * time.Minute

// AssertConfig configures the post-load assertion. The zero value is
// valid: every field has a default.
type AssertConfig struct {
	// OnViolation is AssertStop (default) or AssertAlert.
	OnViolation string
	// Interval is how often Asserter.Run asserts (default
	// DefaultAssertInterval; a negative value disables the scheduled run).
	Interval time.Duration
}

func (c AssertConfig) withDefaults() AssertConfig {
	if c.OnViolation == "" {
		c.OnViolation = AssertStop
	}
	if c.Interval == 0 {
		c.Interval = DefaultAssertInterval
	}
	return c
}

// Asserter runs the post-load assertion: no business key is held by more
// than one target row. A violation is an error wrapping
// tidemark.ErrDuplicateKeys; with on_violation "stop" it is returned (and
// stops the pipeline), with "alert" it is logged and counted.
type Asserter struct {
	target tidemark.AssertTarget
	cfg    AssertConfig
	log    *slog.Logger
	count  func(error)

	mu   sync.Mutex
	last time.Time // target clock at the previous scheduled run
}

// NewAsserter returns an Asserter over the tables target applies. count,
// if set, is told every violation (stop or alert), e.g. to count it in a
// metric; log may be nil.
func NewAsserter(target tidemark.AssertTarget, cfg AssertConfig, log *slog.Logger, count func(error)) *Asserter {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Asserter{target: target, cfg: cfg.withDefaults(), log: log.With("component", "assert"), count: count}
}

// AfterLoad asserts on the keys of the rows loaded at or after since (the
// target's clock; zero: every row) in every table the target has applied.
// Call it after each snapshot or catch-up window with the time the window
// started (the target's Now before loading).
func (a *Asserter) AfterLoad(ctx context.Context, since time.Time) error {
	var errs []error
	for _, t := range a.target.AppliedTables() {
		err := a.target.AssertNoDuplicateKeys(ctx, t, since)
		if err == nil {
			continue
		}
		if !errors.Is(err, tidemark.ErrDuplicateKeys) {
			return fmt.Errorf("post-load assertion: %w", err)
		}
		if a.count != nil {
			a.count(err)
		}
		if a.cfg.OnViolation == AssertAlert {
			a.log.Error("post-load assertion failed (on_violation: alert, the pipeline goes on)", "err", err)
			continue
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Run asserts every Interval on the rows loaded since the previous run
// until ctx is done (returning nil) or a violation stops it (returning the
// error). It does nothing when Interval is negative.
func (a *Asserter) Run(ctx context.Context) error {
	if a.cfg.Interval < 0 {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(a.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		now, err := a.target.Now(ctx)
		if err != nil {
			a.log.Warn("post-load assertion skipped", "err", err)
			continue
		}
		a.mu.Lock()
		since := a.last
		a.last = now
		a.mu.Unlock()
		if err := a.AfterLoad(ctx, since); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, tidemark.ErrDuplicateKeys) {
				return err
			}
			a.log.Warn("post-load assertion could not run", "err", err)
		}
	}
}

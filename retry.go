package tidemark

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"
)

// Backoff is the one retry shape used everywhere: capped exponential backoff
// with full jitter and a limit on attempts.
type Backoff struct {
	// Initial is the first delay (default 100ms).
	Initial time.Duration
	// Max caps the delay (default 10s).
	Max time.Duration
	// Attempts is the maximum number of attempts including the first; 0
	// means retry until ctx is done.
	Attempts int
	// For, when set, also ends the retries once this long has passed
	// since the first attempt (a server restart or failover takes
	// seconds; a source gone for longer is an error to report).
	For time.Duration
}

func (b Backoff) withDefaults() Backoff {
	if b.Initial <= 0 {
		b.Initial = 100 * time.Millisecond
	}
	if b.Max <= 0 {
		b.Max = 10 * time.Second
	}
	return b
}

// Delay returns the jittered delay before retry number n (n ≥ 1).
func (b Backoff) Delay(n int) time.Duration {
	b = b.withDefaults()
	d := b.Initial
	for i := 1; i < n && d < b.Max; i++ {
		d *= 2
	}
	if d > b.Max {
		d = b.Max
	}
	// Full jitter in [d/2, d].
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}

// Retryable marks an error as transient. Classifiers return true for it.
type Retryable struct{ Err error }

func (r *Retryable) Error() string { return r.Err.Error() }
func (r *Retryable) Unwrap() error { return r.Err }

// IsRetryable reports whether err was marked Retryable.
func IsRetryable(err error) bool {
	var r *Retryable
	return errors.As(err, &r)
}

// Retry runs fn until it succeeds, classify says its error is not
// retryable, the attempts or b.For run out or ctx is done. It logs each retry through
// limiter (at most one line per interval). The last error is returned
// wrapped with what was being done.
func Retry(ctx context.Context, what string, b Backoff, classify func(error) bool, log *RateLimitedLogger, fn func(ctx context.Context) error) error {
	b = b.withDefaults()
	start := time.Now()
	for attempt := 1; ; attempt++ {
		err := fn(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return stoppedError(ctx, what, err)
		}
		if !classify(err) {
			return fmt.Errorf("%s: %w", what, err)
		}
		if (b.Attempts > 0 && attempt >= b.Attempts) || (b.For > 0 && time.Since(start) >= b.For) {
			return &exhaustedError{what: what, err: err}
		}
		d := b.Delay(attempt)
		if log != nil {
			log.Warn("retrying after transient error", "op", what, "attempt", attempt, "delay", d, "err", err)
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return stoppedError(ctx, what, err)
		case <-t.C:
		}
	}
}

// stoppedError is Retry's error when ctx ended: the last error, which
// matches ctx's (errors.Is) even when fn's error did not carry it (a
// connection reset seen before the stop), so that a caller can tell a
// stop asked for from a failure.
func stoppedError(ctx context.Context, what string, err error) error {
	if errors.Is(err, ctx.Err()) {
		return fmt.Errorf("%s: %w", what, err)
	}
	return fmt.Errorf("%s: %w (retries stopped: %w)", what, err, ctx.Err())
}

// ErrRetriesExhausted matches (errors.Is) the error Retry returns when a
// transient error outlasted its attempts or its time: the peer did not
// answer for that long, and another call to it now would most likely wait
// as long again.
var ErrRetriesExhausted = errors.New("retries exhausted")

// exhaustedError is Retry's error after its retries ran out; its message is
// the one of any other failure ("what: err").
type exhaustedError struct {
	what string
	err  error
}

func (e *exhaustedError) Error() string        { return e.what + ": " + e.err.Error() }
func (e *exhaustedError) Unwrap() error        { return e.err }
func (e *exhaustedError) Is(target error) bool { return target == ErrRetriesExhausted }

// RateLimitedLogger logs at most one line per Interval for a given message;
// the lines it drops are counted in the next one it writes.
type RateLimitedLogger struct {
	Logger   *slog.Logger
	Interval time.Duration

	mu      sync.Mutex
	last    map[string]time.Time
	dropped map[string]int
}

// Warn logs msg at warn level unless the same msg was logged within the
// interval.
func (l *RateLimitedLogger) Warn(msg string, args ...any) {
	if l == nil || l.Logger == nil {
		return
	}
	l.mu.Lock()
	if l.last == nil {
		l.last, l.dropped = map[string]time.Time{}, map[string]int{}
	}
	iv := l.Interval
	if iv <= 0 {
		iv = 5 * time.Second
	}
	now := time.Now()
	if t, ok := l.last[msg]; ok && now.Sub(t) < iv {
		l.dropped[msg]++
		l.mu.Unlock()
		return
	}
	n := l.dropped[msg]
	l.last[msg], l.dropped[msg] = now, 0
	l.mu.Unlock()
	if n > 0 {
		args = append(args, "suppressed", n)
	}
	l.Logger.Warn(msg, args...)
}

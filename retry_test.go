package tidemark

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestRetryForEndsRetries: Backoff.For ends the retries of a transient
// error once that long has passed since the first attempt, whatever
// Attempts says.
func TestRetryForEndsRetries(t *testing.T) {
	calls := 0
	start := time.Now()
	err := Retry(context.Background(), "probe", Backoff{Initial: 10 * time.Millisecond, Max: 20 * time.Millisecond, For: 200 * time.Millisecond}, func(error) bool { return true }, nil, func(context.Context) error {
		calls++
		return errors.New("down")
	})
	took := time.Since(start)
	if err == nil || err.Error() != "probe: down" {
		t.Fatalf("err = %v, want probe: down", err)
	}
	if took < 200*time.Millisecond || took > 2*time.Second {
		t.Errorf("gave up after %s, want about 200ms", took)
	}
	if calls < 5 {
		t.Errorf("%d attempts in %s, want several", calls, took)
	}
}

// TestRetryExhaustedIsMarked: the error of retries that ran out matches
// ErrRetriesExhausted (a caller then does not ask the same peer again at
// once); a permanent error does not, and both still unwrap to the cause.
func TestRetryExhaustedIsMarked(t *testing.T) {
	down := errors.New("down")
	b := Backoff{Initial: time.Millisecond, Max: time.Millisecond, Attempts: 3}
	err := Retry(context.Background(), "probe", b, func(error) bool { return true }, nil, func(context.Context) error { return down })
	if !errors.Is(err, ErrRetriesExhausted) || !errors.Is(err, down) || err.Error() != "probe: down" {
		t.Errorf("transient error after its attempts: %v (exhausted %v, cause %v), want probe: down marked exhausted",
			err, errors.Is(err, ErrRetriesExhausted), errors.Is(err, down))
	}
	err = Retry(context.Background(), "probe", b, func(error) bool { return false }, nil, func(context.Context) error { return down })
	if errors.Is(err, ErrRetriesExhausted) || !errors.Is(err, down) {
		t.Errorf("permanent error: %v marked exhausted %v, want unmarked", err, errors.Is(err, ErrRetriesExhausted))
	}
}

// TestRetryStoppedMatchesTheStop: a Retry whose ctx ends (SIGTERM during a
// start-up) returns an error that matches the ctx's (context.Canceled)
// besides the last transient error, whether the stop came during the
// backoff or during an attempt whose error did not carry it, so the caller
// tells the stop asked for from a failure.
func TestRetryStoppedMatchesTheStop(t *testing.T) {
	down := errors.New("connection reset by peer")
	for _, during := range []string{"backoff", "attempt"} {
		ctx, cancel := context.WithCancel(context.Background())
		calls := 0
		b := Backoff{Initial: time.Hour, Max: time.Hour}
		if during == "backoff" {
			time.AfterFunc(50*time.Millisecond, cancel)
		}
		err := Retry(ctx, "probe", b, func(error) bool { return true }, nil, func(context.Context) error {
			calls++
			if during == "attempt" {
				cancel()
			}
			return down
		})
		cancel()
		if !errors.Is(err, context.Canceled) || !errors.Is(err, down) || calls != 1 {
			t.Errorf("stopped during the %s: %v after %d attempts (canceled %v, cause %v), want one attempt and both",
				during, err, calls, errors.Is(err, context.Canceled), errors.Is(err, down))
		}
	}
	// An attempt's error that already is the stop is not wrapped twice.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := Retry(ctx, "probe", Backoff{}, func(error) bool { return true }, nil, func(ctx context.Context) error { return ctx.Err() })
	if err == nil || err.Error() != "probe: context canceled" {
		t.Errorf("an attempt that returns the stop: %v, want probe: context canceled", err)
	}
}

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

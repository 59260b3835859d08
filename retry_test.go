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

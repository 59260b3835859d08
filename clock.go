package tidemark

import (
	"context"
	"time"
)

// Clock reads a database's clock: a target's, to stamp and compare load
// times ("rows loaded since"), or a source's, to measure clock skew.
type Clock interface {
	// Now returns the database's current time (UTC).
	Now(ctx context.Context) (time.Time, error)
}

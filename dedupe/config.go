package dedupe

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"tidemark"
)

// Defaults applied by New to zero fields of Config.
const (
	// DefaultDelay is the watermark delay used when Config.Delay is zero.
	DefaultDelay = 10 * time.Minute
	// DefaultMaxKeys is the state bound used when Config.MaxKeys is zero.
	// A key costs about 200 bytes of state, so the default holds ~20 MB:
	// enough for the hot keys of a window, within the daemon's memory
	// budget (a backlog of a million distinct keys would otherwise hold
	// ~200 MB and make every GC cycle scan it). Evicting is safe.
	DefaultMaxKeys = 100_000
)

// Config configures a Window. The zero value of every field but
// EventTimeColumns has a documented default; New validates the rest once and
// names the offending field in its error.
type Config struct {
	// Delay is how far the watermark trails the largest event time seen:
	// watermark = max event time − Delay. A change whose event time is below
	// the watermark is late and passed on without a duplicate check; the
	// state of a key is evicted once the watermark passes its event time +
	// Delay. Zero means DefaultDelay; a negative value is an error.
	Delay time.Duration
	// Tolerance is how far ahead of the wall clock (Now) an event time may be
	// before it is clamped to Now + Tolerance for the watermark and the
	// state (counted as ClampedFuture), so that one far-future row cannot
	// push the watermark forward and empty the window. Zero means no
	// tolerance at all (any event time after Now is clamped); a negative
	// value is an error. Something like a minute absorbs ordinary clock skew
	// between the source and this host.
	Tolerance time.Duration
	// MaxKeys bounds the number of keys held in state (least recently passed
	// keys are evicted first, counted as EvictedCapacity). Evicting is always
	// safe: a key without state never has its changes dropped, and the sink's
	// version guard makes a re-applied change a no-op. Zero means
	// DefaultMaxKeys; a negative value is an error.
	MaxKeys int
	// EventTimeColumns names, per table, a column whose value is the event
	// time of a change (the After image, or Before for a delete). Values are
	// the UTC time.Time the sources produce for DATE, DATETIME and TIMESTAMP.
	// When the value is NULL, not a time, or the column is missing from the
	// table, the source commit time is used instead (counted as
	// EventTimeFallback). Tables not listed use the commit time. Names must
	// pass tidemark.ValidIdentifier.
	EventTimeColumns map[tidemark.TableID]string
	// Now returns the wall clock used to clamp future event times. It is
	// called once per Filter call. Nil means time.Now.
	Now func() time.Time
	// Logger receives the window's few log lines (a configured event-time
	// column missing from a table). Nil means slog.Default().
	Logger *slog.Logger
}

// withDefaults returns cfg with zero fields set to their defaults and
// validates it.
func (cfg Config) withDefaults() (Config, error) {
	switch {
	case cfg.Delay < 0:
		return cfg, errors.New("dedupe config: delay: must be > 0")
	case cfg.Delay == 0:
		cfg.Delay = DefaultDelay
	}
	if cfg.Tolerance < 0 {
		return cfg, errors.New("dedupe config: tolerance: must be >= 0")
	}
	switch {
	case cfg.MaxKeys < 0:
		return cfg, errors.New("dedupe config: max_keys: must be > 0")
	case cfg.MaxKeys == 0:
		cfg.MaxKeys = DefaultMaxKeys
	}
	for id, col := range cfg.EventTimeColumns {
		if err := tidemark.CheckIdentifier("database", id.Database); err != nil {
			return cfg, fmt.Errorf("dedupe config: event_time_columns: table %q: %w", id, err)
		}
		if err := tidemark.CheckIdentifier("table", id.Name); err != nil {
			return cfg, fmt.Errorf("dedupe config: event_time_columns: table %q: %w", id, err)
		}
		if err := tidemark.CheckIdentifier("column", col); err != nil {
			return cfg, fmt.Errorf("dedupe config: event_time_columns: table %s: %w", id, err)
		}
	}
	if cfg.EventTimeColumns != nil {
		cols := make(map[tidemark.TableID]string, len(cfg.EventTimeColumns))
		for id, col := range cfg.EventTimeColumns {
			cols[id] = col
		}
		cfg.EventTimeColumns = cols
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Logger = cfg.Logger.With("component", "dedupe")
	return cfg, nil
}

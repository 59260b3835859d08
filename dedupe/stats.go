package dedupe

// Stats are the window's counters since New, for metrics. Every field is a monotonic counter except Keys, a gauge.
//
// Every snapshot returned by Window.Stats satisfies Seen = Passed +
// DroppedDuplicate + DroppedRegression. PassedLate is part of Passed.
type Stats struct {
	// Seen counts the changes given to Filter.
	Seen uint64
	// Passed counts the changes Filter returned.
	Passed uint64
	// DroppedDuplicate counts changes dropped because the last change passed
	// for their key carries the same version (a replay).
	DroppedDuplicate uint64
	// DroppedRegression counts changes dropped because the last change passed
	// for their key carries a newer version.
	DroppedRegression uint64
	// PassedLate counts changes whose event time was below the watermark:
	// passed on without a duplicate check (the sink's version guard is the
	// backstop).
	PassedLate uint64
	// ClampedFuture counts event times further ahead of the wall clock than
	// Config.Tolerance, clamped to Now + Tolerance.
	ClampedFuture uint64
	// EvictedCapacity counts keys evicted from state because it held
	// Config.MaxKeys keys.
	EvictedCapacity uint64
	// EvictedWatermark counts keys evicted from state because the watermark
	// passed their event time + Config.Delay.
	EvictedWatermark uint64
	// EventTimeFallback counts changes of a table with a configured
	// event-time column whose value was NULL, not a time, or missing, so the
	// commit time was used.
	EventTimeFallback uint64
	// Keys is the number of keys currently held in state (a gauge).
	Keys uint64
}

// Each calls fn with the metric name and value of every field of s, in a
// fixed order: seen, passed, dropped_duplicate, dropped_regression,
// passed_late, clamped_future, evicted_capacity, evicted_watermark,
// event_time_fallback, keys.
func (s Stats) Each(fn func(name string, value uint64)) {
	fn("seen", s.Seen)
	fn("passed", s.Passed)
	fn("dropped_duplicate", s.DroppedDuplicate)
	fn("dropped_regression", s.DroppedRegression)
	fn("passed_late", s.PassedLate)
	fn("clamped_future", s.ClampedFuture)
	fn("evicted_capacity", s.EvictedCapacity)
	fn("evicted_watermark", s.EvictedWatermark)
	fn("event_time_fallback", s.EventTimeFallback)
	fn("keys", s.Keys)
}

// add adds the counters of d to s and sets the Keys gauge from d.
func (s *Stats) add(d *Stats) {
	s.Seen += d.Seen
	s.Passed += d.Passed
	s.DroppedDuplicate += d.DroppedDuplicate
	s.DroppedRegression += d.DroppedRegression
	s.PassedLate += d.PassedLate
	s.ClampedFuture += d.ClampedFuture
	s.EvictedCapacity += d.EvictedCapacity
	s.EvictedWatermark += d.EvictedWatermark
	s.EventTimeFallback += d.EventTimeFallback
	s.Keys = d.Keys
}

package tidemark

import (
	"fmt"
	"sync/atomic"
	"time"
)

// Resolve says which instant a local time that is not unique maps to.
type Resolve string

// The resolutions for a DST fold (a local time that happens twice) or gap (a
// local time that never happens).
const (
	// ResolveEarlier takes the earlier instant of a fold; for a gap, the
	// instant the wall clock would show with the offset in force after the
	// gap (it lands before the gap, e.g. 02:30 → 01:30 standard time).
	ResolveEarlier Resolve = "earlier"
	// ResolveLater takes the later instant of a fold; for a gap, the local
	// time shifted forward by the gap's length (02:30 → 03:30 daylight time),
	// as java.time and PostgreSQL do. It is the default for both.
	ResolveLater Resolve = "later"
	// ResolveError rejects the value with ErrAmbiguousTime or
	// ErrNonexistentTime.
	ResolveError Resolve = "error"
)

// Valid reports whether r is one of the defined resolutions.
func (r Resolve) Valid() bool {
	return r == ResolveEarlier || r == ResolveLater || r == ResolveError
}

// ZonePolicy is how local (zone-less) source times are interpreted.
type ZonePolicy struct {
	// Location is the source zone the local times were written in.
	Location *time.Location
	// Fold resolves a repeated local time; Gap a skipped one.
	Fold, Gap Resolve
}

// ToUTC interprets the wall-clock reading of wall (its zone is ignored: the
// digits count) in p.Location and returns the UTC instant, applying the
// fold and gap policy. The host's TZ never matters.
func (p ZonePolicy) ToUTC(wall time.Time) (time.Time, error) {
	loc := p.Location
	if loc == nil {
		loc = time.UTC
	}
	y, mo, d := wall.Date()
	h, mi, s := wall.Clock()
	ns := wall.Nanosecond()
	// The wall reading as if it were UTC.
	u0 := time.Date(y, mo, d, h, mi, s, ns, time.UTC)
	if loc == time.UTC {
		return u0, nil
	}
	var found [2]time.Time
	n := 0
	seen := map[int]bool{}
	for _, delta := range []time.Duration{-48 * time.Hour, -24 * time.Hour, 0, 24 * time.Hour, 48 * time.Hour} {
		_, off := u0.Add(delta).In(loc).Zone()
		if seen[off] {
			continue
		}
		seen[off] = true
		cand := u0.Add(-time.Duration(off) * time.Second)
		if _, o2 := cand.In(loc).Zone(); o2 == off && n < 2 {
			found[n] = cand
			n++
		}
	}
	switch n {
	case 1:
		return found[0].UTC(), nil
	case 2:
		a, b := found[0], found[1]
		if b.Before(a) {
			a, b = b, a
		}
		switch p.Fold {
		case ResolveEarlier:
			return a.UTC(), nil
		case ResolveError:
			return time.Time{}, fmt.Errorf("interpret %s in %s: %w", u0.Format("2006-01-02 15:04:05.999999"), loc, ErrAmbiguousTime)
		default:
			return b.UTC(), nil
		}
	}
	// A gap: offsets before and after the transition.
	_, offBefore := u0.Add(-48 * time.Hour).In(loc).Zone()
	_, offAfter := u0.Add(48 * time.Hour).In(loc).Zone()
	switch p.Gap {
	case ResolveEarlier:
		return u0.Add(-time.Duration(offAfter) * time.Second).UTC(), nil
	case ResolveError:
		return time.Time{}, fmt.Errorf("interpret %s in %s: %w", u0.Format("2006-01-02 15:04:05.999999"), loc, ErrNonexistentTime)
	default:
		return u0.Add(-time.Duration(offBefore) * time.Second).UTC(), nil
	}
}

// ZoneSpan remembers one period of a zone in which ToUTC has a single
// answer, so that a column's values, which mostly fall in the same period,
// skip ToUTC's probes of the offsets two days either side (five or more
// zone lookups per value: a tenth of a snapshot's CPU). The zero value is
// empty; it is safe for concurrent use. One ZoneSpan serves one Location.
type ZoneSpan struct {
	p atomic.Pointer[zoneSpan]
}

// zoneSpan: every wall reading w (as UTC digits) with from ≤ w < to maps
// to the instant w − off.
type zoneSpan struct {
	loc      *time.Location
	from, to time.Time
	off      time.Duration
}

// ToUTCIn is ToUTC, answered from c when wall falls in its period. A wall
// reading whose instants two days either side share one offset (the zone
// period [start, end) of ZoneBounds holds them all) has exactly one
// candidate in ToUTC, wall − offset, whatever the fold and gap policies:
// c then keeps that period, shrunk by the two days, for the next values.
func (p ZonePolicy) ToUTCIn(wall time.Time, c *ZoneSpan) (time.Time, error) {
	loc := p.Location
	if loc == nil || loc == time.UTC || c == nil {
		return p.ToUTC(wall)
	}
	y, mo, d := wall.Date()
	h, mi, sec := wall.Clock()
	u0 := time.Date(y, mo, d, h, mi, sec, wall.Nanosecond(), time.UTC)
	if sp := c.p.Load(); sp != nil && sp.loc == loc && !u0.Before(sp.from) && u0.Before(sp.to) {
		return u0.Add(-sp.off), nil
	}
	const reach = 48 * time.Hour // ToUTC's probes
	at := u0.In(loc)
	start, end := at.ZoneBounds()
	_, off := at.Zone()
	sp := &zoneSpan{loc: loc, off: time.Duration(off) * time.Second, from: start.Add(reach), to: end.Add(-reach)}
	if start.IsZero() {
		sp.from = time.Date(-1000000, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	if end.IsZero() {
		sp.to = time.Date(1000000, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	if sp.from.Before(sp.to) {
		c.p.Store(sp)
		if !u0.Before(sp.from) && u0.Before(sp.to) {
			return u0.Add(-sp.off), nil
		}
	}
	return p.ToUTC(wall)
}

// ToLocal returns the wall-clock reading of the UTC instant t in the source
// zone, labelled UTC so that its digits can be compared with zone-less source
// values (the fallback's bounds for a DATETIME watermark column).
func (p ZonePolicy) ToLocal(t time.Time) time.Time {
	loc := p.Location
	if loc == nil {
		loc = time.UTC
	}
	l := t.In(loc)
	y, mo, d := l.Date()
	h, mi, s := l.Clock()
	return time.Date(y, mo, d, h, mi, s, l.Nanosecond(), time.UTC)
}

// foldSpan bounds how long a fold lasts (how far a zone's clock is ever set
// back at once; one hour almost everywhere, two at most in the tz database).
const foldSpan = 3 * time.Hour

// LocalFloor returns a wall-clock reading, labelled UTC, that is at or
// below the reading of every instant at or after t: the local lower bound
// of a window that starts at t. ToLocal(t) is not one when a fold follows
// within the hour: after the clocks go back, instants later than t show
// earlier readings (America/New_York, 2026-11-01: 05:50Z reads 01:50 EDT,
// 06:10Z reads 01:10 EST), and a predicate "column > 01:50" would skip the
// rows written in the repeated hour. The floor uses the smallest UTC offset
// in force from t to foldSpan after it, so it is lower than ToLocal(t) by
// the fold's length only near a fold.
func (p ZonePolicy) LocalFloor(t time.Time) time.Time {
	loc := p.Location
	if loc == nil {
		loc = time.UTC
	}
	_, off := t.In(loc).Zone()
	// Every transition in (t, t+foldSpan]: offsets change at most a few
	// times a year, so sampling the end and each hour finds them.
	for d := time.Hour; d <= foldSpan; d += time.Hour {
		if _, o := t.Add(d).In(loc).Zone(); o < off {
			off = o
		}
	}
	l := t.UTC().Add(time.Duration(off) * time.Second)
	return time.Date(l.Year(), l.Month(), l.Day(), l.Hour(), l.Minute(), l.Second(), l.Nanosecond(), time.UTC)
}

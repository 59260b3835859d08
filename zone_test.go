package tidemark_test

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"
	_ "time/tzdata"

	"tidemark"
)

func mustLoad(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatalf("load %s: %v", name, err)
	}
	return loc
}

func wall(y int, mo time.Month, d, h, mi, s int) time.Time {
	return time.Date(y, mo, d, h, mi, s, 0, time.UTC)
}

func TestZonePolicyToUTC(t *testing.T) {
	ist := mustLoad(t, "Asia/Kolkata")
	ny := mustLoad(t, "America/New_York")
	tests := []struct {
		name    string
		policy  tidemark.ZonePolicy
		wall    time.Time
		want    time.Time
		wantErr error
	}{
		{"IST incident value", tidemark.ZonePolicy{Location: ist}, wall(2026, 3, 10, 23, 58, 0), wall(2026, 3, 10, 18, 28, 0), nil},
		{"UTC is identity", tidemark.ZonePolicy{Location: time.UTC}, wall(2026, 3, 10, 23, 58, 0), wall(2026, 3, 10, 23, 58, 0), nil},
		{"nil location is UTC", tidemark.ZonePolicy{}, wall(2026, 3, 10, 23, 58, 0), wall(2026, 3, 10, 23, 58, 0), nil},
		{"NY winter", tidemark.ZonePolicy{Location: ny}, wall(2026, 1, 15, 12, 0, 0), wall(2026, 1, 15, 17, 0, 0), nil},
		{"NY summer", tidemark.ZonePolicy{Location: ny}, wall(2026, 7, 15, 12, 0, 0), wall(2026, 7, 15, 16, 0, 0), nil},
		// 2026-11-01 01:30 happens twice in New York (EDT then EST).
		{"fold earlier", tidemark.ZonePolicy{Location: ny, Fold: tidemark.ResolveEarlier}, wall(2026, 11, 1, 1, 30, 0), wall(2026, 11, 1, 5, 30, 0), nil},
		{"fold later", tidemark.ZonePolicy{Location: ny, Fold: tidemark.ResolveLater}, wall(2026, 11, 1, 1, 30, 0), wall(2026, 11, 1, 6, 30, 0), nil},
		{"fold default is later", tidemark.ZonePolicy{Location: ny}, wall(2026, 11, 1, 1, 30, 0), wall(2026, 11, 1, 6, 30, 0), nil},
		{"fold error", tidemark.ZonePolicy{Location: ny, Fold: tidemark.ResolveError}, wall(2026, 11, 1, 1, 30, 0), time.Time{}, tidemark.ErrAmbiguousTime},
		// 2026-03-08 02:30 never happens in New York.
		{"gap later", tidemark.ZonePolicy{Location: ny, Gap: tidemark.ResolveLater}, wall(2026, 3, 8, 2, 30, 0), wall(2026, 3, 8, 7, 30, 0), nil},
		{"gap earlier", tidemark.ZonePolicy{Location: ny, Gap: tidemark.ResolveEarlier}, wall(2026, 3, 8, 2, 30, 0), wall(2026, 3, 8, 6, 30, 0), nil},
		{"gap error", tidemark.ZonePolicy{Location: ny, Gap: tidemark.ResolveError}, wall(2026, 3, 8, 2, 30, 0), time.Time{}, tidemark.ErrNonexistentTime},
		{"just before gap", tidemark.ZonePolicy{Location: ny, Gap: tidemark.ResolveError}, wall(2026, 3, 8, 1, 59, 59), wall(2026, 3, 8, 6, 59, 59), nil},
		{"just after gap", tidemark.ZonePolicy{Location: ny, Gap: tidemark.ResolveError}, wall(2026, 3, 8, 3, 0, 0), wall(2026, 3, 8, 7, 0, 0), nil},
		{"microseconds kept", tidemark.ZonePolicy{Location: ist}, time.Date(2026, 3, 10, 23, 58, 0, 123456000, time.UTC), time.Date(2026, 3, 10, 18, 28, 0, 123456000, time.UTC), nil},
		{"pre-1970", tidemark.ZonePolicy{Location: ist}, wall(1969, 12, 31, 23, 0, 0), wall(1969, 12, 31, 17, 30, 0), nil},
	}
	// The host zone must not matter.
	for _, local := range []string{"UTC", "Asia/Kolkata", "America/New_York"} {
		saved := time.Local
		time.Local = mustLoad(t, local)
		for _, tc := range tests {
			t.Run(local+"/"+tc.name, func(t *testing.T) {
				got, err := tc.policy.ToUTC(tc.wall)
				if tc.wantErr != nil {
					if !errors.Is(err, tc.wantErr) {
						t.Fatalf("err = %v, want %v", err, tc.wantErr)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if !got.Equal(tc.want) || got.Location() != time.UTC {
					t.Fatalf("got %s (%s), want %s UTC", got, got.Location(), tc.want)
				}
				// Round trip back to the wall clock (not for gaps).
				if tc.name != "gap later" && tc.name != "gap earlier" {
					if back := tc.policy.ToLocal(got); !back.Equal(tc.wall) {
						t.Fatalf("ToLocal(%s) = %s, want %s", got, back, tc.wall)
					}
				}
			})
		}
		time.Local = saved
	}
}

// TestZonePolicyLocalFloor: the local lower bound of a window is at or below
// the wall-clock reading of every later instant, also across a fold, and is
// ToLocal itself away from one.
func TestZonePolicyLocalFloor(t *testing.T) {
	ny := tidemark.ZonePolicy{Location: mustLoad(t, "America/New_York")}
	// 05:50Z reads 01:50 EDT; 06:10Z, later, reads 01:10 EST.
	if got, want := ny.LocalFloor(wall(2026, 11, 1, 5, 50, 0)), wall(2026, 11, 1, 0, 50, 0); !got.Equal(want) {
		t.Fatalf("floor of 05:50Z on the fold day = %s, want %s", got, want)
	}
	if got, want := ny.LocalFloor(wall(2026, 7, 15, 16, 0, 0)), wall(2026, 7, 15, 12, 0, 0); !got.Equal(want) {
		t.Fatalf("floor in July = %s, want %s (ToLocal)", got, want)
	}
	for _, z := range []struct {
		name string
		from time.Time
	}{{"America/New_York", wall(2026, 10, 31, 22, 0, 0)}, {"Australia/Lord_Howe", wall(2026, 4, 4, 10, 0, 0)}, {"Asia/Kolkata", wall(2026, 3, 10, 0, 0, 0)}} {
		p := tidemark.ZonePolicy{Location: mustLoad(t, z.name)}
		for lo := z.from; lo.Before(z.from.Add(12 * time.Hour)); lo = lo.Add(5 * time.Minute) {
			floor := p.LocalFloor(lo)
			for u := lo; u.Before(lo.Add(4 * time.Hour)); u = u.Add(time.Minute) {
				if l := p.ToLocal(u); l.Before(floor) {
					t.Fatalf("%s: floor of %s is %s, but the later instant %s reads %s", z.name, lo, floor, u, l)
				}
			}
		}
	}
}

// TestZoneSpanMatchesToUTC: ToUTCIn with a shared ZoneSpan returns exactly
// what ToUTC returns (instant, location, error), for wall readings swept in
// order and in random order through years of transitions, in zones with
// DST (New York, London, Lord Howe's 30-minute shift, Santiago), without
// (Kolkata) and with a change of standard offset (Pyongyang 2015/2018),
// under every fold and gap policy.
func TestZoneSpanMatchesToUTC(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for _, name := range []string{"America/New_York", "Europe/London", "Australia/Lord_Howe", "America/Santiago", "Asia/Kolkata", "Asia/Pyongyang"} {
		loc, err := time.LoadLocation(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, res := range []tidemark.Resolve{tidemark.ResolveEarlier, tidemark.ResolveLater, tidemark.ResolveError} {
			p := tidemark.ZonePolicy{Location: loc, Fold: res, Gap: res}
			var span tidemark.ZoneSpan
			check := func(w time.Time) {
				want, werr := p.ToUTC(w)
				got, gerr := p.ToUTCIn(w, &span)
				if (werr == nil) != (gerr == nil) || werr != nil && werr.Error() != gerr.Error() || !got.Equal(want) || got.Location() != want.Location() {
					t.Fatalf("%s %s: ToUTCIn(%s) = %v, %v; ToUTC = %v, %v", name, res, w.Format("2006-01-02 15:04:05.999999"), got, gerr, want, werr)
				}
			}
			start := time.Date(2014, 1, 1, 0, 0, 0, 0, time.UTC)
			for w := start; w.Year() < 2020; w = w.Add(17 * time.Minute) {
				check(w)
			}
			for i := 0; i < 20000; i++ {
				check(start.Add(time.Duration(rng.Int64N(int64(6 * 365 * 24 * time.Hour)))))
			}
		}
	}
}

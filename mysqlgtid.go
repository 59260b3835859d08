package tidemark

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// MySQLGTIDSet is a MySQL GTID set ("3e11fa47-…:1-5:11-18,uuid2:1-7"): for
// each source (a server_uuid, or "uuid:tag" for MySQL 8.4 tagged GTIDs) the
// transaction numbers executed, as sorted, disjoint, non-adjacent closed
// intervals.
//
// Unlike a MariaDB GTID position it is not a point on a line: two sets are
// ordered only when one contains the other (Compare).
type MySQLGTIDSet map[string][]GTIDInterval

// GTIDInterval is the closed range of transaction numbers [Start, End].
type GTIDInterval struct {
	Start, End uint64
}

// ParseMySQLGTIDSet parses MySQL's text form. UUIDs are lower-cased;
// whitespace and newlines (as @@gtid_executed prints them) are ignored. The
// empty string is the empty set.
func ParseMySQLGTIDSet(s string) (MySQLGTIDSet, error) {
	set := MySQLGTIDSet{}
	s = strings.Map(func(r rune) rune {
		if r == ' ' || r == '\n' || r == '\r' || r == '\t' {
			return -1
		}
		return r
	}, s)
	if s == "" {
		return set, nil
	}
	for _, part := range strings.Split(s, ",") {
		f := strings.Split(part, ":")
		if len(f) < 2 || !isUUID(f[0]) {
			return nil, fmt.Errorf("parse MySQL GTID set %q: %q is not uuid:interval", s, part)
		}
		src := strings.ToLower(f[0])
		for _, iv := range f[1:] {
			if iv == "" {
				return nil, fmt.Errorf("parse MySQL GTID set %q: empty interval in %q", s, part)
			}
			if c := iv[0]; c < '0' || c > '9' {
				// A tag (MySQL 8.4): the intervals after it belong to uuid:tag.
				if !ValidIdentifier(iv) {
					return nil, fmt.Errorf("parse MySQL GTID set %q: invalid tag %q", s, iv)
				}
				src = strings.ToLower(f[0]) + ":" + strings.ToLower(iv)
				continue
			}
			a, b, isRange := strings.Cut(iv, "-")
			start, err := strconv.ParseUint(a, 10, 64)
			if err != nil || start == 0 {
				return nil, fmt.Errorf("parse MySQL GTID set %q: bad interval %q", s, iv)
			}
			end := start
			if isRange {
				if end, err = strconv.ParseUint(b, 10, 64); err != nil || end < start {
					return nil, fmt.Errorf("parse MySQL GTID set %q: bad interval %q", s, iv)
				}
			}
			set.Add(src, GTIDInterval{start, end})
		}
	}
	return set, nil
}

func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i, c := range s {
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
				return false
			}
		}
	}
	return true
}

// Add adds an interval to the set, merging it with overlapping or adjacent
// ones.
func (s MySQLGTIDSet) Add(source string, iv GTIDInterval) {
	ivs := append(s[source], iv)
	sort.Slice(ivs, func(i, j int) bool { return ivs[i].Start < ivs[j].Start })
	out := ivs[:0]
	for _, x := range ivs {
		if n := len(out); n > 0 && x.Start <= out[n-1].End+1 {
			if x.End > out[n-1].End {
				out[n-1].End = x.End
			}
			continue
		}
		out = append(out, x)
	}
	s[source] = out
}

// Contains reports whether the transaction source:n is in the set.
func (s MySQLGTIDSet) Contains(source string, n uint64) bool {
	for _, iv := range s[strings.ToLower(source)] {
		if n >= iv.Start && n <= iv.End {
			return true
		}
	}
	return false
}

// ContainsSet reports whether every transaction of o is in s.
func (s MySQLGTIDSet) ContainsSet(o MySQLGTIDSet) bool {
	for src, ivs := range o {
		have := s[src]
		for _, iv := range ivs {
			// Intervals are merged: iv is covered only by one interval.
			covered := false
			for _, h := range have {
				if iv.Start >= h.Start && iv.End <= h.End {
					covered = true
					break
				}
			}
			if !covered {
				return false
			}
		}
	}
	return true
}

// Compare orders two sets by inclusion: 0 if equal, -1 if s is a proper
// subset of o (o executed everything s did, and more), +1 if a proper
// superset. Sets that each hold a transaction the other lacks are
// ErrIncomparable: neither is "later".
func (s MySQLGTIDSet) Compare(o MySQLGTIDSet) (int, error) {
	sub, sup := o.ContainsSet(s), s.ContainsSet(o)
	switch {
	case sub && sup:
		return 0, nil
	case sub:
		return -1, nil
	case sup:
		return 1, nil
	}
	return 0, fmt.Errorf("compare GTID sets %s and %s: %w", s, o, ErrIncomparable)
}

// String formats the set as MySQL does: sources in ascending order,
// intervals ascending, "uuid:1-5:7".
func (s MySQLGTIDSet) String() string {
	srcs := make([]string, 0, len(s))
	for k, ivs := range s {
		if len(ivs) > 0 {
			srcs = append(srcs, k)
		}
	}
	sort.Strings(srcs)
	var b strings.Builder
	for i, src := range srcs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(src)
		for _, iv := range s[src] {
			b.WriteByte(':')
			b.WriteString(strconv.FormatUint(iv.Start, 10))
			if iv.End != iv.Start {
				b.WriteByte('-')
				b.WriteString(strconv.FormatUint(iv.End, 10))
			}
		}
	}
	return b.String()
}

// Subtract returns the transactions of s that are not in o.
func (s MySQLGTIDSet) Subtract(o MySQLGTIDSet) MySQLGTIDSet {
	out := MySQLGTIDSet{}
	for src, ivs := range s {
		for _, iv := range ivs {
			rest := []GTIDInterval{iv}
			for _, h := range o[src] {
				var next []GTIDInterval
				for _, r := range rest {
					if h.End < r.Start || h.Start > r.End {
						next = append(next, r)
						continue
					}
					if h.Start > r.Start {
						next = append(next, GTIDInterval{r.Start, h.Start - 1})
					}
					if h.End < r.End {
						next = append(next, GTIDInterval{h.End + 1, r.End})
					}
				}
				rest = next
			}
			for _, r := range rest {
				out.Add(src, r)
			}
		}
	}
	return out
}

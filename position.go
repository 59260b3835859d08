package tidemark

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Position is a point in a source's binlog, always at a transaction boundary:
// resuming from it streams the first transaction not yet applied.
//
// GTID is the server's GTID set after the last applied transaction (MariaDB
// "0-1001-42,1-1002-7"; MySQL "uuid:1-42"). File and Offset are the binlog
// file and the offset just after that transaction's commit event. Either part
// may be empty. Which part a resume uses depends on the flavor (binlog.Tailer):
// MariaDB resumes by GTID when the position has one (by file and offset
// otherwise, recovering the GTID position there with BINLOG_GTID_POS); MySQL
// resumes by GTID set when the server runs with gtid_mode=ON and the
// position has one, by file and offset otherwise.
//
// Source is the identity of the server the position was read from and Epoch
// the version epoch it belongs to (see SourceIdentity and EpochShift): both
// are stored with every checkpoint, so that a restart or reconnect can tell
// whether the server it reaches is the one the position means.
type Position struct {
	GTID   string
	File   string
	Offset uint64
	Epoch  uint32
	Source SourceIdentity
}

// IsZero reports whether p holds no place in a binlog (an identity or epoch
// alone is not a place).
func (p Position) IsZero() bool { return p.GTID == "" && p.File == "" && p.Offset == 0 }

// String formats p as "gtid=G;file=F;pos=N;epoch=E;src=S", leaving out empty
// parts (and epoch 0). Parse reads it back.
func (p Position) String() string {
	var parts []string
	if p.GTID != "" {
		parts = append(parts, "gtid="+p.GTID)
	}
	if p.File != "" {
		parts = append(parts, "file="+p.File, "pos="+strconv.FormatUint(p.Offset, 10))
	}
	if p.Epoch != 0 {
		parts = append(parts, "epoch="+formatEpoch(p.Epoch))
	}
	if !p.Source.IsZero() {
		parts = append(parts, "src="+p.Source.String())
	}
	return strings.Join(parts, ";")
}

// ParsePosition parses the String form of a Position. The empty string is the
// zero Position.
func ParsePosition(s string) (Position, error) {
	var p Position
	if strings.TrimSpace(s) == "" {
		return p, nil
	}
	seenPos := false
	for _, part := range strings.Split(s, ";") {
		k, v, ok := strings.Cut(part, "=")
		if !ok {
			return Position{}, fmt.Errorf("parse position %q: part %q is not key=value", s, part)
		}
		switch k {
		case "gtid":
			if _, err := ParseMariaDBGTIDSet(v); err != nil {
				if _, err2 := ParseMySQLGTIDSet(v); err2 != nil {
					return Position{}, fmt.Errorf("parse position %q: %w", s, err)
				}
			}
			p.GTID = v
		case "epoch":
			n, err := strconv.ParseUint(v, 10, 32)
			if err != nil || n > MaxEpoch {
				return Position{}, fmt.Errorf("parse position %q: invalid epoch %q", s, v)
			}
			p.Epoch = uint32(n)
		case "src":
			id, err := ParseSourceIdentity(v)
			if err != nil {
				return Position{}, fmt.Errorf("parse position %q: %w", s, err)
			}
			p.Source = id
		case "file":
			if v == "" || strings.ContainsAny(v, "/\\") {
				return Position{}, fmt.Errorf("parse position %q: invalid file %q", s, v)
			}
			p.File = v
		case "pos":
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return Position{}, fmt.Errorf("parse position %q: invalid pos: %w", s, err)
			}
			p.Offset = n
			seenPos = true
		default:
			return Position{}, fmt.Errorf("parse position %q: unknown part %q", s, k)
		}
	}
	if p.File != "" && !seenPos {
		return Position{}, fmt.Errorf("parse position %q: file without pos", s)
	}
	return p, nil
}

// Compare orders two positions of one source: -1 if p is before o, 0 if
// equal, +1 if after.
//
//   - Epochs first: every position of a later epoch (after a followed
//     identity change) is after every position of an earlier one.
//   - Within one epoch, positions read from different known identities
//     are ErrIncomparable (an unknown identity, from a checkpoint written
//     before identities were stored, matches any).
//   - Two positions of one known identity (and epoch) that both carry a
//     file and offset of its binlog are ordered by them: the server's own
//     total order, which a GTID sequence going backwards on a MariaDB
//     server without gtid_strict_mode does not follow.
//   - Then GTIDs where both have them: a MariaDB GTID position per domain
//     (ahead in one domain and behind in another is ErrIncomparable), a
//     MySQL GTID set by inclusion. GTIDs survive a failover; file names do
//     not.
//   - Otherwise file/offset (binlog file index, then offset), which orders
//     the positions of one server only.
//
// Anything else (a GTID against a bare file position of another flavor,
// unparsable parts) is ErrIncomparable: a guess would drop or repeat data.
func (p Position) Compare(o Position) (int, error) {
	if p.Epoch != o.Epoch {
		return cmpU(uint64(p.Epoch), uint64(o.Epoch)), nil
	}
	incomparable := func() (int, error) {
		return 0, fmt.Errorf("compare positions %s and %s: %w", p, o, ErrIncomparable)
	}
	if !p.Source.IsZero() && !o.Source.IsZero() && p.Source != o.Source {
		return incomparable()
	}
	if !p.Source.IsZero() && p.Source == o.Source && p.File != "" && o.File != "" && binlogBase(p.File) == binlogBase(o.File) {
		// One server, one epoch: its binlog's own order. A GTID
		// sequence can go backwards on it (MariaDB without
		// gtid_strict_mode: SET gtid_seq_no, a mysqlbinlog replay, two
		// masters sharing a domain), its file and offset cannot
		// (review finding 11).
		pi, err1 := BinlogFileIndex(p.File)
		oi, err2 := BinlogFileIndex(o.File)
		if err1 == nil && err2 == nil {
			if pi != oi {
				return cmpU(pi, oi), nil
			}
			return cmpU(p.Offset, o.Offset), nil
		}
	}
	if p.GTID != "" && o.GTID != "" {
		if p.GTID == o.GTID {
			return 0, nil
		}
		if ps, err := ParseMariaDBGTIDSet(p.GTID); err == nil {
			os, err := ParseMariaDBGTIDSet(o.GTID)
			if err != nil {
				return incomparable()
			}
			return ps.Compare(os)
		}
		ps, err1 := ParseMySQLGTIDSet(p.GTID)
		os, err2 := ParseMySQLGTIDSet(o.GTID)
		if err1 != nil || err2 != nil {
			return incomparable()
		}
		return ps.Compare(os)
	}
	if p.File != "" && o.File != "" {
		pi, err1 := BinlogFileIndex(p.File)
		oi, err2 := BinlogFileIndex(o.File)
		if err1 != nil || err2 != nil || binlogBase(p.File) != binlogBase(o.File) {
			return incomparable()
		}
		if pi != oi {
			return cmpU(pi, oi), nil
		}
		return cmpU(p.Offset, o.Offset), nil
	}
	if p.IsZero() && o.IsZero() {
		return 0, nil
	}
	if p.IsZero() != o.IsZero() && (p.GTID == "" && o.GTID == "" || isMariaDBGTID(p.GTID+o.GTID)) {
		// The zero position (the start of the binlog, an empty MariaDB
		// GTID state) is before any other.
		if p.IsZero() {
			return -1, nil
		}
		return 1, nil
	}
	return incomparable()
}

func isMariaDBGTID(s string) bool {
	_, err := ParseMariaDBGTIDSet(s)
	return err == nil
}

// binlogBase is a binlog file name without its numeric suffix.
func binlogBase(file string) string {
	if i := strings.LastIndexByte(file, '.'); i >= 0 {
		return file[:i]
	}
	return file
}

func cmpU(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// BinlogFileIndex returns the numeric suffix of a binlog file name
// ("mysql-bin.000042" → 42).
func BinlogFileIndex(file string) (uint64, error) {
	i := strings.LastIndexByte(file, '.')
	if i < 0 || i == len(file)-1 {
		return 0, fmt.Errorf("parse binlog file %q: no numeric suffix", file)
	}
	n, err := strconv.ParseUint(file[i+1:], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse binlog file %q: %w", file, err)
	}
	return n, nil
}

// MariaDBGTID is one MariaDB GTID: domain-server-sequence.
type MariaDBGTID struct {
	Domain   uint32
	ServerID uint32
	Seq      uint64
}

// String formats the GTID as "domain-server-seq".
func (g MariaDBGTID) String() string {
	return fmt.Sprintf("%d-%d-%d", g.Domain, g.ServerID, g.Seq)
}

// MariaDBGTIDSet is a MariaDB GTID position: the last GTID per domain.
type MariaDBGTIDSet map[uint32]MariaDBGTID

// ParseMariaDBGTIDSet parses "0-1001-42,1-1002-7". The empty string is the
// empty set.
func ParseMariaDBGTIDSet(s string) (MariaDBGTIDSet, error) {
	set := MariaDBGTIDSet{}
	s = strings.TrimSpace(s)
	if s == "" {
		return set, nil
	}
	for _, part := range strings.Split(s, ",") {
		f := strings.Split(strings.TrimSpace(part), "-")
		if len(f) != 3 {
			return nil, fmt.Errorf("parse MariaDB GTID %q: want domain-server-seq", part)
		}
		d, err1 := strconv.ParseUint(f[0], 10, 32)
		sv, err2 := strconv.ParseUint(f[1], 10, 32)
		q, err3 := strconv.ParseUint(f[2], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			return nil, fmt.Errorf("parse MariaDB GTID %q: not numeric", part)
		}
		if _, dup := set[uint32(d)]; dup {
			return nil, fmt.Errorf("parse MariaDB GTID set %q: domain %d twice", s, d)
		}
		set[uint32(d)] = MariaDBGTID{Domain: uint32(d), ServerID: uint32(sv), Seq: q}
	}
	return set, nil
}

// String formats the set with domains in ascending order.
func (s MariaDBGTIDSet) String() string {
	doms := make([]int, 0, len(s))
	for d := range s {
		doms = append(doms, int(d))
	}
	sort.Ints(doms)
	parts := make([]string, len(doms))
	for i, d := range doms {
		parts[i] = s[uint32(d)].String()
	}
	return strings.Join(parts, ",")
}

// Compare orders two sets by sequence number per domain. A domain missing
// from one set counts as sequence 0. Sets that are ahead of each other in
// different domains are incomparable.
func (s MariaDBGTIDSet) Compare(o MariaDBGTIDSet) (int, error) {
	less, more := false, false
	seen := map[uint32]bool{}
	check := func(d uint32) {
		if seen[d] {
			return
		}
		seen[d] = true
		a, b := s[d].Seq, o[d].Seq
		if a < b {
			less = true
		} else if a > b {
			more = true
		}
	}
	for d := range s {
		check(d)
	}
	for d := range o {
		check(d)
	}
	switch {
	case less && more:
		return 0, fmt.Errorf("compare GTID sets %s and %s: %w", s, o, ErrIncomparable)
	case less:
		return -1, nil
	case more:
		return 1, nil
	}
	return 0, nil
}

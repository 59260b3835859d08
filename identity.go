package tidemark

import (
	"fmt"
	"strconv"
	"strings"
)

// SourceIdentity says which server, binlog and version scheme a position
// was read from. A position is only meaningful together with it: file
// mysql-bin.000042 of one server says nothing about another server's file of
// that name, and versions of one scheme do not order against another's. It
// is stored with every checkpoint (Position.Source) and compared with the
// server's identity on every start and reconnect (see docs/FAILOVER.md for
// the rules that follow a change or refuse it).
//
// The zero value is "unknown": a checkpoint written before identities were
// recorded, or a start position from the config.
type SourceIdentity struct {
	// Flavor is "mariadb" or "mysql".
	Flavor string
	// Server is the server's identity: MySQL's server_uuid, MariaDB's
	// server_id in decimal.
	Server string
	// Domain is MariaDB's gtid_domain_id in decimal ("" for MySQL).
	Domain string
	// Scheme is the version scheme the positions' versions were made with:
	// "gtid" or "filepos".
	Scheme string
	// Basename is the binlog's base name ("mysql-bin" for files
	// mysql-bin.000001, …), without a directory.
	Basename string
}

// IsZero reports whether the identity is unknown.
func (s SourceIdentity) IsZero() bool { return s == SourceIdentity{} }

// String formats the identity as "flavor/server/domain/scheme/basename",
// the form stored in a position; ParseSourceIdentity reads it back.
func (s SourceIdentity) String() string {
	if s.IsZero() {
		return ""
	}
	return strings.Join([]string{s.Flavor, s.Server, s.Domain, s.Scheme, s.Basename}, "/")
}

// ParseSourceIdentity parses the String form. The empty string is the zero
// identity.
func ParseSourceIdentity(v string) (SourceIdentity, error) {
	if v == "" {
		return SourceIdentity{}, nil
	}
	f := strings.Split(v, "/")
	if len(f) != 5 {
		return SourceIdentity{}, fmt.Errorf("parse source identity %q: want flavor/server/domain/scheme/basename", v)
	}
	s := SourceIdentity{Flavor: f[0], Server: f[1], Domain: f[2], Scheme: f[3], Basename: f[4]}
	if err := s.Validate(); err != nil {
		return SourceIdentity{}, err
	}
	return s, nil
}

// Validate checks that every part is present and cannot break the stored
// form.
func (s SourceIdentity) Validate() error {
	for _, p := range []struct{ name, v string }{{"flavor", s.Flavor}, {"server", s.Server}, {"scheme", s.Scheme}, {"basename", s.Basename}} {
		if p.v == "" {
			return fmt.Errorf("source identity %q: %s is empty", s.String(), p.name)
		}
	}
	for _, v := range []string{s.Flavor, s.Server, s.Domain, s.Scheme, s.Basename} {
		if strings.ContainsAny(v, "/;= \t\n") {
			return fmt.Errorf("source identity: part %q contains a separator", v)
		}
	}
	return nil
}

// Changes lists what differs between the identity a position was read from
// (s) and another one, as "server 1001 → 1002" phrases; nil when they are
// equal or s is unknown.
func (s SourceIdentity) Changes(o SourceIdentity) []string {
	if s.IsZero() || s == o {
		return nil
	}
	var out []string
	add := func(what, a, b string) {
		if a != b {
			out = append(out, fmt.Sprintf("%s %s → %s", what, orDash(a), orDash(b)))
		}
	}
	add("flavor", s.Flavor, o.Flavor)
	add("server", s.Server, o.Server)
	add("GTID domain", s.Domain, o.Domain)
	add("version scheme", s.Scheme, o.Scheme)
	add("binlog basename", s.Basename, o.Basename)
	return out
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// EpochShift is where a version's epoch starts in Version.Seq: the top bits
// (56–62) hold the epoch, the low 56 bits the position within it. Bit 63 is
// never set, so that a Seq fits a signed 64-bit column.
//
// The epoch is advanced each time tidemark follows a change of the source's
// identity (a failover, a reset binlog, a switched version scheme): every
// version made after the change is larger than every version made before
// it, whatever the new server's GTID sequence or binlog file numbers are.
// Epoch 0 leaves Seq exactly as it was before epochs existed, so rows and
// checkpoints written by earlier releases keep their meaning.
const EpochShift = 56

// MaxEpoch is the largest epoch a Seq can carry.
const MaxEpoch = 1<<(63-EpochShift) - 1

// MaxSeqInEpoch is the largest position-derived sequence an epoch holds.
const MaxSeqInEpoch = 1<<EpochShift - 1

// EpochSeq combines an epoch and a sequence within it into a Version.Seq.
// It fails when either is too large, naming both.
func EpochSeq(epoch uint32, seq uint64) (uint64, error) {
	if epoch > MaxEpoch {
		return 0, fmt.Errorf("make version: epoch %d is above %d (the source changed identity too often): re-seed the target", epoch, MaxEpoch)
	}
	if seq > MaxSeqInEpoch {
		return 0, fmt.Errorf("make version: sequence %d does not fit in %d bits", seq, EpochShift)
	}
	return uint64(epoch)<<EpochShift | seq, nil
}

// Epoch returns the epoch a version was made in.
func (v Version) Epoch() uint32 { return uint32(v.Seq >> EpochShift) }

func formatEpoch(e uint32) string { return strconv.FormatUint(uint64(e), 10) }

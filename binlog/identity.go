package binlog

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/go-mysql-org/go-mysql/mysql"

	"tidemark"
)

// serverState is what the tailer reads of the server on every connect: who
// it is, and how far its binlog goes.
type serverState struct {
	id tidemark.SourceIdentity
	// gtidPos is @@gtid_binlog_pos (MariaDB) or @@gtid_executed (MySQL).
	gtidPos string
	// gtidState is MariaDB's @@gtid_binlog_state: the last GTID of each
	// (domain, server_id) in the binlog.
	gtidState string
	// strict and slaveUpdates are MariaDB's gtid_strict_mode and
	// log_slave_updates.
	strict, slaveUpdates bool
	// gtidMode is MySQL's gtid_mode ("ON", "OFF", …).
	gtidMode string
	// lastFile is the newest binlog file, files all of them.
	lastFile string
	files    map[string]bool
	fileList []string // in order
	// errant are transactions of a new MySQL primary that it executed
	// before it had the checkpoint's (placeErrant); empty when none.
	errant string
	// legacyElsewhere says why a checkpoint without an identity cannot be
	// this server's (placeLegacy); empty when it can.
	legacyElsewhere string
	// notAtCheckpoint says why the binlog at the checkpoint's file and
	// offset is not what the checkpoint saw there (MySQL, see
	// checkAtCheckpoint); "" when it is, or cannot be told.
	notAtCheckpoint string
	// backwards says, on MariaDB, that a domain's last GTID is below the
	// checkpoint's although the binlog holds the checkpoint (see
	// placeBackwards): a sequence number went backwards after it; ""
	// otherwise.
	backwards string
}

// inspect reads what resolve needs to know about the stored checkpoint on
// this server beyond its state: placeLegacy and placeErrant.
func (t *Tailer) inspect(ctx context.Context, stored tidemark.Position, st *serverState) error {
	if err := t.placeLegacy(ctx, stored, st); err != nil {
		return err
	}
	if err := t.checkAtCheckpoint(ctx, stored, st); err != nil {
		return err
	}
	if err := t.placeBackwards(ctx, stored, st); err != nil {
		return err
	}
	return t.placeErrant(ctx, stored, st)
}

// placeBackwards looks, when a MariaDB binlog's last GTID of a domain is
// below the checkpoint's (gtidBelow), whether the binlog still holds the
// checkpoint (nemesis seed 301640696642): its file is listed, an event
// starts at its offset and BINLOG_GTID_POS there is the checkpoint's GTID
// position. Without gtid_strict_mode a transaction can be committed with a
// lower sequence number (SET gtid_seq_no, a mysqlbinlog replay for a
// point-in-time recovery), and @@gtid_binlog_pos and @@gtid_binlog_state,
// which hold each domain's (and server's) last GTID, not its highest, show
// that number until the next transaction. Such a binlog is not behind the
// checkpoint; RESET MASTER, a restored backup or another server with the
// same server_id has other GTIDs at that offset, or none. The server
// refuses the checkpoint's GTID then ("not in the master's binlog"), so
// the stream starts at the file and offset (Resolution.ByFile).
func (t *Tailer) placeBackwards(ctx context.Context, stored tidemark.Position, st *serverState) error {
	if t.cfg.Flavor != FlavorMariaDB || stored.GTID == "" || stored.File == "" || stored.Offset == 0 || !st.files[stored.File] || st.notAtCheckpoint != "" {
		return nil
	}
	if !stored.Source.IsZero() && (stored.Source.Server != st.id.Server || stored.Source.Basename != st.id.Basename) {
		return nil
	}
	below, why := gtidBelow(stored, *st)
	if !below || st.backwards != "" {
		return nil
	}
	got, same, err := t.gtidPosAt(ctx, stored)
	if err != nil {
		return err
	}
	if same {
		st.backwards = fmt.Sprintf("%s, though the binlog holds the checkpoint: %s:%d is %s in it (a GTID sequence number went backwards after it, without gtid_strict_mode: SET gtid_seq_no, a mysqlbinlog replay)", why, stored.File, stored.Offset, got)
	}
	return nil
}

// gtidPosAt reads MariaDB's BINLOG_GTID_POS at the stored position's file
// and offset (NULL, "", when no event starts there or the file is not in
// the binlog) and reports whether it is the position's GTID set.
func (t *Tailer) gtidPosAt(ctx context.Context, stored tidemark.Position) (string, bool, error) {
	r, err := t.query(ctx, "SELECT BINLOG_GTID_POS(?, ?)", stored.File, stored.Offset)
	if err != nil {
		return "", false, fmt.Errorf("place checkpoint %s on source %s: %w", stored, t.cfg.Name, err)
	}
	got, _ := r.GetString(0, 0)
	want, err1 := tidemark.ParseMariaDBGTIDSet(stored.GTID)
	have, err2 := tidemark.ParseMariaDBGTIDSet(got)
	return got, got != "" && err1 == nil && err2 == nil && want.String() == have.String(), nil
}

// placeErrant looks, when a MySQL checkpoint of another server is to be
// followed by GTID (rule 4), for errant transactions on the new primary
// (review finding 13): transactions it executed before it had all of the
// checkpoint's — a local change on the replica, later overwritten by the
// old primary's changes that tidemark applied. MySQL's auto-positioning
// sends them (they are not in the checkpoint's set), and in the new epoch
// they would win over the newer rows. A transaction is known to come
// before the checkpoint's when it is in a binlog file's Previous_gtids
// that does not hold the whole checkpoint: the Previous_gtids of the last
// such file, less the checkpoint, are errant. (Transactions in the very
// file where the checkpoint's last transaction arrived cannot be placed
// this way; they are taken as the new primary's.)
func (t *Tailer) placeErrant(ctx context.Context, stored tidemark.Position, st *serverState) error {
	if t.cfg.Flavor != FlavorMySQL || stored.GTID == "" || stored.Source.IsZero() || stored.Source == st.id {
		return nil
	}
	want, err := tidemark.ParseMySQLGTIDSet(stored.GTID)
	if err != nil {
		return nil // resolve refuses it
	}
	var lacking tidemark.MySQLGTIDSet
	for _, f := range st.fileList {
		r, err := t.query(ctx, "SHOW BINLOG EVENTS IN '"+strings.ReplaceAll(f, "'", "''")+"' LIMIT 2")
		if err != nil {
			return fmt.Errorf("read the Previous_gtids of %s on source %s: %w", f, t.cfg.Name, err)
		}
		var prev tidemark.MySQLGTIDSet
		for i := 0; i < r.RowNumber(); i++ {
			if typ, _ := r.GetString(i, 2); strings.EqualFold(typ, "Previous_gtids") {
				info, _ := r.GetString(i, 5)
				if prev, err = tidemark.ParseMySQLGTIDSet(info); err != nil {
					return fmt.Errorf("read the Previous_gtids of %s on source %s: %w", f, t.cfg.Name, err)
				}
			}
		}
		if prev == nil {
			continue
		}
		if prev.ContainsSet(want) {
			break
		}
		lacking = prev
	}
	if e := lacking.Subtract(want); len(e) > 0 {
		st.errant = e.String()
	}
	return nil
}

// placeLegacy checks a checkpoint written before identities were stored
// against the server, before it is taken as this server's (review finding
// 10): its file and offset must be in this server's binlog — on MariaDB
// BINLOG_GTID_POS(file, offset) must give the checkpoint's GTID position,
// on MySQL the file must be one of its binary logs. Otherwise the
// checkpoint is another server's (an old primary, whose filepos versions
// do not order against this one's) and st.legacyElsewhere says why.
func (t *Tailer) placeLegacy(ctx context.Context, stored tidemark.Position, st *serverState) error {
	// Without GTIDs there is nothing to follow elsewhere: a file the
	// server lacks is a purged position (the fallback's case), as before.
	if !stored.Source.IsZero() || stored.File == "" || stored.GTID == "" {
		return nil
	}
	if t.cfg.Flavor != FlavorMariaDB {
		if !st.files[stored.File] {
			st.legacyElsewhere = fmt.Sprintf("the legacy checkpoint's file %s is not in this server's binlog", stored.File)
		}
		return nil
	}
	got, same, err := t.gtidPosAt(ctx, stored)
	if err != nil {
		return err
	}
	if !same {
		st.legacyElsewhere = fmt.Sprintf("the legacy checkpoint's %s:%d is %s in this server's binlog, not %s", stored.File, stored.Offset, orNone(got), stored.GTID)
	}
	return nil
}

// checkAtCheckpoint looks at the event at a checkpoint's file and offset
// on the checkpoint's own server (MySQL and MariaDB): it must start there
// (a boundary) and, when it is a transaction, be one the checkpoint's GTID
// set does not hold yet — on MySQL after the set's last transaction of
// this server, the next one it wrote. RESET BINARY LOGS AND GTIDS (RESET
// MASTER; MariaDB's RESET MASTER alike) restarts the binlog
// and the GTID numbers: once the server has written as many transactions
// again, its gtid_executed covers the checkpoint's set, and only the binlog
// itself tells that they are other transactions. The answer is recorded in
// st (behind reads it); a server that cannot show the event (purged file,
// no privilege) is not judged here.
func (t *Tailer) checkAtCheckpoint(ctx context.Context, stored tidemark.Position, st *serverState) error {
	if stored.GTID == "" || stored.File == "" || stored.Offset == 0 {
		return nil
	}
	if !stored.Source.IsZero() && (stored.Source.Server != st.id.Server || stored.Source.Basename != st.id.Basename) {
		return nil // another server: its file/offset mean nothing here
	}
	var set tidemark.MySQLGTIDSet
	var mset map[uint32]tidemark.MariaDBGTID
	var err error
	switch t.cfg.Flavor {
	case FlavorMySQL:
		set, err = tidemark.ParseMySQLGTIDSet(stored.GTID)
	case FlavorMariaDB:
		mset, err = tidemark.ParseMariaDBGTIDSet(stored.GTID)
	default:
		return nil
	}
	if err != nil {
		return nil
	}
	r, err := t.query(ctx, "SHOW BINLOG EVENTS IN '"+strings.ReplaceAll(stored.File, "'", "")+"' FROM "+strconv.FormatUint(stored.Offset, 10)+" LIMIT 1")
	if err != nil {
		var me *mysql.MyError
		// "Wrong offset or I/O error" (8.0), "Error reading Log_event at
		// position …: Failed decoding event" (9.x); not a missing file.
		if errors.As(err, &me) && me.Code == mysql.ER_ERROR_WHEN_EXECUTING_COMMAND && !strings.Contains(me.Message, "Could not find target log") {
			st.notAtCheckpoint = fmt.Sprintf("no event starts at %s:%d, where the checkpoint's last transaction ended", stored.File, stored.Offset)
		}
		return nil
	}
	if r.RowNumber() == 0 {
		return nil // the end of the file: nothing written after it yet
	}
	// MySQL 9 answers an offset inside an event with the next event; 8.0
	// with "Wrong offset or I/O error".
	if at, _ := r.GetUint(0, 1); at != stored.Offset {
		st.notAtCheckpoint = fmt.Sprintf("no event starts at %s:%d, where the checkpoint's last transaction ended", stored.File, stored.Offset)
		return nil
	}
	typ, _ := r.GetString(0, 2)
	info, _ := r.GetString(0, 5)
	if !boundaryEvent(typ) {
		// With GTIDs on, every transaction starts with a Gtid event: an
		// Xid, Table_map, rows or Query event here is inside one, a
		// transaction of another history (RESET MASTER, then as many
		// bytes again).
		st.notAtCheckpoint = fmt.Sprintf("the event at %s:%d, where the checkpoint's last transaction ended, is a %s event, inside a transaction", stored.File, stored.Offset, typ)
		return nil
	}
	if !strings.EqualFold(typ, "Gtid") {
		return nil
	}
	if t.cfg.Flavor == FlavorMariaDB {
		// The next transaction's GTID ("BEGIN GTID 0-1-43"): the
		// checkpoint must not hold it already. Without gtid_strict_mode
		// a sequence may legitimately go backwards (gtid_seq_no).
		m := mariaGTIDRE.FindStringSubmatch(info)
		if m == nil || !st.strict {
			return nil
		}
		g, err := tidemark.ParseMariaDBGTIDSet(m[1])
		if err != nil {
			return nil
		}
		for d, next := range g {
			if have, ok := mset[d]; ok && next.Seq <= have.Seq {
				// After RESET MASTER the binlog's GTID position at
				// the offset is the new history's (strict mode: below
				// the next transaction's). The checkpoint's own
				// there means the sequence went backwards after it
				// while strict mode was off (placeBackwards).
				got, same, err := t.gtidPosAt(ctx, stored)
				if err != nil {
					return err
				}
				if same {
					st.backwards = fmt.Sprintf("the transaction at %s:%d, right after the checkpoint, is %s, though the binlog holds the checkpoint: %s:%d is %s in it (a GTID sequence number went backwards after it, committed while gtid_strict_mode was off: SET gtid_seq_no, a mysqlbinlog replay)", stored.File, stored.Offset, m[1], stored.File, stored.Offset, got)
					return nil
				}
				st.notAtCheckpoint = fmt.Sprintf("the transaction at %s:%d, right after the checkpoint, is %s, which the checkpoint already holds", stored.File, stored.Offset, m[1])
			}
		}
		return nil
	}
	m := gtidNextRE.FindStringSubmatch(info)
	if m == nil {
		return nil
	}
	g, err := tidemark.ParseMySQLGTIDSet(m[1])
	if err != nil {
		return nil
	}
	if set.ContainsSet(g) {
		st.notAtCheckpoint = fmt.Sprintf("the transaction at %s:%d, right after the checkpoint, is %s, which the checkpoint already holds", stored.File, stored.Offset, m[1])
		return nil
	}
	// The server's own next transaction follows its last one in the set.
	if ivs, mine := g[st.id.Server]; mine && len(ivs) == 1 {
		if own := set[st.id.Server]; len(own) > 0 {
			if last := own[len(own)-1].End; ivs[0].Start != last+1 {
				st.notAtCheckpoint = fmt.Sprintf("the transaction at %s:%d, right after the checkpoint, is %s, not %s:%d", stored.File, stored.Offset, m[1], st.id.Server, last+1)
			}
		}
	}
	return nil
}

// boundaryEvent reports whether an event of type typ (SHOW BINLOG EVENTS'
// Event_type) can follow a committed transaction in a binlog with GTIDs:
// the next transaction's Gtid event (MySQL's anonymous and tagged ones
// too) or an event between transactions (rotation, server stop, MariaDB's
// binlog checkpoint, the headers of a file).
func boundaryEvent(typ string) bool {
	switch strings.ToLower(typ) {
	case "gtid", "anonymous_gtid", "gtid_tagged", "rotate", "stop", "binlog_checkpoint", "gtid_list",
		"format_desc", "previous_gtids", "start_encryption", "incident":
		return true
	}
	return false
}

// gtidNextRE finds the GTID in SHOW BINLOG EVENTS' Info of a Gtid event.
var gtidNextRE = regexp.MustCompile(`GTID_NEXT\s*=\s*'([^']+)'`)

// mariaGTIDRE finds the GTID in the Info of a MariaDB Gtid event.
var mariaGTIDRE = regexp.MustCompile(`GTID\s+(\d+-\d+-\d+)`)

// readServer reads the server's identity and binlog state.
func (t *Tailer) readServer(ctx context.Context) (serverState, error) {
	var st serverState
	st.id = tidemark.SourceIdentity{Flavor: t.cfg.Flavor, Scheme: t.cfg.Version}
	var base string
	if t.cfg.Flavor == FlavorMariaDB {
		r, err := t.query(ctx, "SELECT @@server_id, @@log_bin_basename, @@gtid_domain_id, @@gtid_strict_mode, @@log_slave_updates, @@gtid_binlog_pos, @@gtid_binlog_state")
		if err != nil {
			return st, fmt.Errorf("read identity of source %s: %w", t.cfg.Name, err)
		}
		sid, _ := r.GetUint(0, 0)
		base, _ = r.GetString(0, 1)
		dom, _ := r.GetUint(0, 2)
		strict, _ := r.GetInt(0, 3)
		slave, _ := r.GetInt(0, 4)
		st.gtidPos, _ = r.GetString(0, 5)
		st.gtidState, _ = r.GetString(0, 6)
		st.id.Server = strconv.FormatUint(sid, 10)
		st.id.Domain = strconv.FormatUint(dom, 10)
		st.strict, st.slaveUpdates = strict == 1, slave == 1
	} else {
		r, err := t.query(ctx, "SELECT @@server_uuid, @@log_bin_basename, @@gtid_mode, @@gtid_executed")
		if err != nil {
			return st, fmt.Errorf("read identity of source %s: %w", t.cfg.Name, err)
		}
		st.id.Server, _ = r.GetString(0, 0)
		st.id.Server = strings.ToLower(st.id.Server)
		base, _ = r.GetString(0, 1)
		st.gtidMode, _ = r.GetString(0, 2)
		st.gtidPos, _ = r.GetString(0, 3)
	}
	st.id.Basename = path.Base(base)
	if base == "" {
		st.id.Basename = ""
	}
	r, err := t.query(ctx, "SHOW BINARY LOGS")
	if err != nil {
		return st, fmt.Errorf("list binary logs of %s: %w", t.cfg.Name, err)
	}
	st.files = map[string]bool{}
	for i := 0; i < r.RowNumber(); i++ {
		name, _ := r.GetString(i, 0)
		st.files[name] = true
		st.fileList = append(st.fileList, name)
		st.lastFile = name
	}
	if st.id.Basename == "" && st.lastFile != "" {
		st.id.Basename = binlogBase(st.lastFile)
	}
	if err := st.id.Validate(); err != nil {
		return st, fmt.Errorf("read identity of source %s: %w: %w", t.cfg.Name, err, tidemark.ErrSourceConfig)
	}
	return st, nil
}

func binlogBase(file string) string {
	if i := strings.LastIndexByte(file, '.'); i >= 0 {
		return file[:i]
	}
	return file
}

// lineage is the epoch and identity the source's positions are made in
// now. The Tailer sets it whenever it resolves a position against the
// server; the Reader sharing it (NewReaderFor) stamps captured positions and
// rows with it, so that a catch-up after a reset binlog or a changed server
// writes versions of the new epoch.
type lineage struct {
	mu    sync.Mutex
	known bool
	epoch uint32
	id    tidemark.SourceIdentity // zero: any server (a legacy checkpoint)
}

// Seed records the stored checkpoint as the lineage before anything has
// connected, so that a Reader sharing it (a resync or partial catch-up run
// while no daemon streams) stamps its rows with the checkpoint's epoch, or
// the next one when the server is no longer the checkpoint's.
func (t *Tailer) Seed(stored tidemark.Position) {
	e, _ := t.floor.lift(stored.Epoch, stored.Source)
	t.lin.set(e, stored.Source)
}

func (l *lineage) set(epoch uint32, id tidemark.SourceIdentity) {
	l.mu.Lock()
	l.known, l.epoch, l.id = true, epoch, id
	l.mu.Unlock()
}

// epochFor returns the epoch positions read from server id belong to: the
// lineage's when id is its identity, the next one when the server changed
// since, 0 when nothing is known yet (a first start).
func (l *lineage) epochFor(id tidemark.SourceIdentity) (uint32, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case !l.known:
		return 0, false
	case l.id == id || l.id.IsZero():
		return l.epoch, false
	}
	return l.epoch + 1, true
}

// Resolution is how a stored position relates to the server the source's
// address reaches now.
type Resolution struct {
	// Start is the position to stream from, stamped with the server's
	// identity and the epoch its versions are made in.
	Start tidemark.Position
	// Changed lists what changed since the position was stored
	// ("server 1001 → 1002"); empty when nothing did.
	Changed []string
	// Note explains, for people, what following the change means (the
	// log line at the switch).
	Note string
	// ByFile says that the stream must start at Start's file and offset,
	// not its GTID: MariaDB refuses a GTID above the domain's last one
	// (placeBackwards).
	ByFile bool
}

// Resolve compares a stored position with the server the source's address
// reaches now, without streaming, and says how the tailer would go on: the
// position and epoch it would start from, or an error wrapping
// ErrSourceChanged (cannot be followed; also ErrPositionAhead when the
// server's binlog is behind the checkpoint). It records the outcome
// for the Reader sharing this tailer's lineage. `tidemark doctor` and
// `tidemark catchup` use it; Stream does the same on every connect.
func (t *Tailer) Resolve(ctx context.Context, stored tidemark.Position) (Resolution, error) {
	st, err := t.readServer(ctx)
	if err != nil {
		return Resolution{}, err
	}
	if err := t.inspect(ctx, stored, &st); err != nil {
		return Resolution{}, err
	}
	return t.resolve(stored, st)
}

// Accept records that the operator accepts the current server as the
// source's from the next epoch on (`tidemark catchup` after a change
// Resolve refused: the catch-up re-reads the tables from this server, and
// its rows win over everything written before).
func (t *Tailer) Accept(ctx context.Context, stored tidemark.Position) (tidemark.SourceIdentity, uint32, error) {
	st, err := t.readServer(ctx)
	if err != nil {
		return tidemark.SourceIdentity{}, 0, err
	}
	if err := t.inspect(ctx, stored, &st); err != nil {
		return tidemark.SourceIdentity{}, 0, err
	}
	epoch := stored.Epoch
	if !stored.Source.IsZero() && stored.Source != st.id {
		epoch++
	} else if res, err := t.resolve(stored, st); err != nil {
		epoch++
	} else if res.Start.Epoch > epoch {
		epoch = res.Start.Epoch // a legacy checkpoint of another server
	}
	epoch, _ = t.floor.lift(epoch, st.id)
	if epoch > tidemark.MaxEpoch {
		return st.id, 0, fmt.Errorf("accept source %s: epoch %d is above %d: re-seed the target", t.cfg.Name, epoch, tidemark.MaxEpoch)
	}
	t.lin.set(epoch, st.id)
	return st.id, epoch, nil
}

// resolve is Resolve on a server state already read. The rules, one
// sentence each (docs/FAILOVER.md):
//
//  1. Same identity, binlog not behind the position: resume, same epoch.
//  2. Same identity, binlog behind the position (RESET MASTER, a restored
//     backup): ErrPositionAhead and ErrSourceChanged, naming `tidemark
//     catchup`, which re-reads the tables in the next epoch (Accept): the
//     changes between the position and the reset are in no binlog, and a
//     restored backup looks the same, so nothing is followed blindly.
//  3. Only the version scheme changed: resume at the same position in the
//     next epoch, so the new scheme's versions win over the old ones.
//  4. Another server (or domain, or binlog name) that has the position's
//     GTIDs in its binlog — MariaDB with gtid_strict_mode, MySQL with
//     gtid_mode=ON (its set must contain the position's) — resume by GTID
//     in the next epoch (the log says what the old primary may have had).
//  5. Anything else (another flavor; another server without the
//     position's GTIDs, or without GTIDs at all): ErrSourceChanged, naming
//     what changed and what to do.
//
// A position without an identity (written before identities were stored)
// is taken as this server's, with the checks of rule 1 and 2.
func (t *Tailer) resolve(stored tidemark.Position, st serverState) (Resolution, error) {
	res, err := t.resolveRules(stored, st)
	if err != nil {
		return res, err
	}
	e, lifted := t.floor.lift(res.Start.Epoch, st.id)
	if !lifted {
		return res, nil
	}
	if e > tidemark.MaxEpoch {
		return res, fmt.Errorf("resume source %s: the epoch floor %d leaves no epoch above it (%d is the last): re-seed the target: %w", t.cfg.Name, t.floor.epoch, tidemark.MaxEpoch, tidemark.ErrSourceChanged)
	}
	note := fmt.Sprintf("the checkpoint %s is in epoch %d, but this source's rows were written in epoch %d (server %s; kept apart from the checkpoint, which was deleted, edited or replaced by source.start_position): resuming in epoch %d, so that its changes do not lose to the rows already in the target",
		orNone(stored.String()), res.Start.Epoch, t.floor.epoch, orNone(t.floor.id.String()), e)
	if res.Note != "" {
		note = res.Note + "; " + note
	}
	res.Note = note
	res.Changed = append(res.Changed, fmt.Sprintf("epoch %d → %d (epoch floor)", res.Start.Epoch, e))
	res.Start.Epoch = e
	t.lin.set(e, st.id)
	return res, nil
}

// epochFloor is the highest epoch the source's rows were written in and the
// server of that epoch (kept in the target by the checkpoint package, apart
// from the checkpoint).
type epochFloor struct {
	known bool
	epoch uint32
	id    tidemark.SourceIdentity // zero: unknown
}

// lift returns the epoch a stream from server id must use instead of e:
// e itself when it is above the floor, or the floor's epoch on the floor's
// server; else the floor's epoch on its own server, or the next one on
// another (or an unknown) server.
func (f epochFloor) lift(e uint32, id tidemark.SourceIdentity) (uint32, bool) {
	switch {
	case !f.known || e > f.epoch:
		return e, false
	case f.id == id && !id.IsZero():
		return f.epoch, e != f.epoch
	case e == f.epoch && f.id.IsZero():
		return e, false
	}
	return f.epoch + 1, true
}

// SetEpochFloor records the source's epoch floor (read from the target): no
// position is resumed, and no Reader sharing the lineage stamps rows, in an
// epoch below it. Call it before Stream, Resolve, Accept or Seed.
func (t *Tailer) SetEpochFloor(floor tidemark.Position) {
	t.floor = epochFloor{known: true, epoch: floor.Epoch, id: floor.Source}
}

// resolveRules is resolve before the epoch floor.
func (t *Tailer) resolveRules(stored tidemark.Position, st serverState) (Resolution, error) {
	res := Resolution{Start: stored}
	res.Start.Source = st.id
	prev := stored.Source
	legacy := prev.IsZero()
	if legacy {
		prev = st.id
	}
	name := t.cfg.Name
	res.Changed = prev.Changes(st.id)
	next := stored.Epoch + 1
	if next > tidemark.MaxEpoch {
		next = tidemark.MaxEpoch // refused below when it is needed
	}
	refuse := func(what, todo string) (Resolution, error) {
		return res, fmt.Errorf("resume source %s: %s (%s); checkpoint %s: %s: %w",
			name, what, strings.Join(res.Changed, ", "), stored, todo, tidemark.ErrSourceChanged)
	}
	catchUpTodo := fmt.Sprintf("stop tidemark and run `tidemark catchup --config …` to re-read every table from the server %s reaches now (its rows then win over everything written before; run `tidemark verify` afterwards: rows only the old server had are listed as target-only)", name)
	if stored.IsZero() {
		// A first start: nothing to compare.
		t.lin.set(stored.Epoch, st.id)
		return res, nil
	}
	if stored.Epoch >= tidemark.MaxEpoch && len(res.Changed) > 0 {
		return refuse("the version epoch is exhausted", "re-seed the target")
	}
	if prev.Flavor != st.id.Flavor {
		return refuse("the source is another kind of server", "set source.flavor to what the server is, or re-seed the target for the new server")
	}
	sameServer := prev.Server == st.id.Server && prev.Domain == st.id.Domain && prev.Basename == st.id.Basename
	if legacy && st.legacyElsewhere != "" {
		// Not this server's after all: followed like another server's.
		sameServer = false
		res.Changed = append(res.Changed, st.legacyElsewhere)
	}
	behind, why := t.behind(stored, st)
	if sameServer && !behind && st.backwards != "" {
		if st.id.Scheme == VersionGTID {
			// The binlog holds the checkpoint, but version: gtid
			// cannot order what follows it.
			return res, fmt.Errorf("resume source %s: %s; version: gtid orders changes by that number, and rows older than the checkpoint would win over the changes after it: set gtid_strict_mode=ON, and source.version: filepos (tidemark then resumes at the checkpoint %s in the next epoch, ordering by binlog position): %w",
				name, st.backwards, stored, tidemark.ErrSourceConfig)
		}
		res.ByFile = true
		res.Note = "resuming at the checkpoint's file and offset: " + st.backwards
	}
	switch {
	case sameServer && !behind:
		if prev.Scheme != st.id.Scheme {
			// Rule 3.
			res.Start.Epoch = next
			res.Note = joinNote(res.Note, fmt.Sprintf("version scheme changed from %s to %s: versions from here on are in epoch %d and win over every row written before", prev.Scheme, st.id.Scheme, next))
		} else {
			// Rule 1.
			res.Start.Epoch = stored.Epoch
			if legacy {
				res.Note = joinNote(res.Note, "the position has no source identity (a configured start_position, or a checkpoint written by an earlier release): taking it as this server's")
			}
		}
		t.lin.set(res.Start.Epoch, st.id)
		return res, nil
	case sameServer:
		// Rule 2.
		if len(res.Changed) == 0 {
			res.Changed = []string{"binlog behind the checkpoint"}
		}
		return res, fmt.Errorf("resume source %s: the server's binlog is behind the checkpoint %s (%s): RESET MASTER, a restored backup, or another server with the same server_id; the changes between the checkpoint and that point are in no binlog, and following blindly would skip or double them: %s: %w: %w",
			name, stored, why, catchUpTodo, tidemark.ErrPositionAhead, tidemark.ErrSourceChanged)
	}
	// Another server, domain or binlog.
	if stored.GTID == "" || (t.cfg.Flavor == FlavorMySQL && !strings.EqualFold(st.gtidMode, "ON")) {
		return refuse("the source's address reaches another server, and the checkpoint's file/offset mean nothing on it",
			catchUpTodo)
	}
	if t.cfg.Flavor == FlavorMariaDB && !st.strict {
		return refuse("the source's address reaches another server, which runs without gtid_strict_mode (its GTIDs cannot be trusted to follow the old server's)",
			"set gtid_strict_mode=ON on it, or "+catchUpTodo)
	}
	if behind {
		return refuse(fmt.Sprintf("the new server lacks transactions tidemark already applied (%s): it lagged behind the old primary, and the target holds changes the new primary does not have", why),
			catchUpTodo)
	}
	if st.errant != "" {
		return refuse(fmt.Sprintf("the new server executed transactions before it had the checkpoint's (%s: errant transactions, e.g. a local change on the replica before its promotion): following by GTID would replay them in a new epoch, over the newer rows", st.errant),
			catchUpTodo)
	}
	// Rule 4: resume by GTID; the old server's file/offset are dropped.
	res.Start = tidemark.Position{GTID: stored.GTID, Epoch: next, Source: st.id}
	res.Note = fmt.Sprintf("following a changed source by GTID %s in epoch %d: changes from here on win over every row written before. The old primary may have committed transactions after that GTID that never reached the new one: tidemark never applied them (but for the first part of a transaction split across batches), and they are not in the new primary; `tidemark verify` lists any such row as target-only", stored.GTID, next)
	t.lin.set(next, st.id)
	return res, nil
}

// behind reports whether the server's binlog ends before the stored
// position: a GTID domain whose sequence is lower than the position's, or
// (without GTIDs) a newest binlog file older than the position's.
func (t *Tailer) behind(stored tidemark.Position, st serverState) (bool, string) {
	if t.cfg.Flavor == FlavorMariaDB && stored.GTID != "" {
		_, err1 := tidemark.ParseMariaDBGTIDSet(stored.GTID)
		_, err2 := tidemark.ParseMariaDBGTIDSet(st.gtidPos)
		if err1 == nil && err2 == nil {
			if below, why := gtidBelow(stored, st); below && st.backwards == "" {
				return true, why
			}
			// RESET MASTER restarts the numbers: once the server wrote
			// as many transactions again, only the binlog at the
			// checkpoint's file and offset tells they are others.
			if st.notAtCheckpoint != "" {
				return true, st.notAtCheckpoint + " (RESET MASTER?)"
			}
			return false, ""
		}
	}
	if t.cfg.Flavor == FlavorMySQL && stored.GTID != "" {
		want, err1 := tidemark.ParseMySQLGTIDSet(stored.GTID)
		have, err2 := tidemark.ParseMySQLGTIDSet(st.gtidPos)
		if err1 == nil && err2 == nil {
			if !have.ContainsSet(want) {
				return true, fmt.Sprintf("GTID set %s, the server has executed %s", stored.GTID, orNone(st.gtidPos))
			}
			if st.notAtCheckpoint != "" {
				return true, st.notAtCheckpoint + " (RESET BINARY LOGS AND GTIDS?)"
			}
			if behind, why := fileBehind(stored, st); behind {
				return true, why
			}
			return false, ""
		}
	}
	return fileBehind(stored, st)
}

// gtidBelow reports whether a MariaDB server's binlog state is below the
// stored position's GTIDs: a domain whose last sequence number is lower, or
// whose last GTID from the position's server is.
func gtidBelow(stored tidemark.Position, st serverState) (bool, string) {
	want, err1 := tidemark.ParseMariaDBGTIDSet(stored.GTID)
	have, err2 := tidemark.ParseMariaDBGTIDSet(st.gtidPos)
	if err1 != nil || err2 != nil {
		return false, ""
	}
	for _, d := range slices.Sorted(maps.Keys(want)) {
		g := want[d]
		h, ok := have[d]
		if !ok || h.Seq < g.Seq {
			return true, fmt.Sprintf("GTID %s, the server's binlog has %s", g, orNone(st.gtidPos))
		}
		// The server's binlog has later sequence numbers of the
		// domain; it has g itself only if its last GTID from g's
		// server is g or later (gtid_binlog_state). A replica
		// promoted before it received g writes its own
		// transactions over the same numbers.
		if st.gtidState != "" && !stateHas(st.gtidState, g) {
			return true, fmt.Sprintf("GTID %s is not in the server's binlog (its GTID state is %s)", g, st.gtidState)
		}
	}
	return false, ""
}

// fileBehind reports whether the server's newest binlog file is older than
// the stored position's (same basename).
func fileBehind(stored tidemark.Position, st serverState) (bool, string) {
	if stored.File != "" && st.lastFile != "" && binlogBase(stored.File) == binlogBase(st.lastFile) {
		si, err1 := tidemark.BinlogFileIndex(stored.File)
		li, err2 := tidemark.BinlogFileIndex(st.lastFile)
		if err1 == nil && err2 == nil && li < si {
			return true, fmt.Sprintf("file %s, the server's newest binlog is %s", stored.File, st.lastFile)
		}
	}
	return false, ""
}

// joinNote appends note b to a ("; " between them).
func joinNote(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// checkDomains refuses, at start, a MariaDB server whose GTID state has
// several replication domains when versions are GTID sequence numbers:
// sequences of different domains do not order against each other, and a
// stream that meets a second domain can only stop (and would stop again on
// every restart). version: filepos orders by this server's binlog instead
// and still resumes by GTID, per domain.
func (t *Tailer) checkDomains(st serverState) error {
	if t.cfg.Flavor != FlavorMariaDB || t.cfg.Version != VersionGTID {
		return nil
	}
	set, err := tidemark.ParseMariaDBGTIDSet(st.gtidPos)
	if err != nil {
		return fmt.Errorf("check source %s: read @@gtid_binlog_pos %q: %w", t.cfg.Name, st.gtidPos, err)
	}
	if len(set) > 1 {
		return fmt.Errorf("check source %s: its binlog has %d GTID domains (%s) and version: gtid orders the sequence numbers of one domain only: set source.version: filepos (versions by binlog position, resume by GTID per domain), or remove unused domains with FLUSH BINARY LOGS DELETE_DOMAIN_ID: %w",
			t.cfg.Name, len(set), set, tidemark.ErrSourceConfig)
	}
	return nil
}

// stateHas reports whether a MariaDB @@gtid_binlog_state ("0-1-10,0-2-15")
// holds g or a later GTID of g's domain and server.
func stateHas(state string, g tidemark.MariaDBGTID) bool {
	for _, part := range strings.Split(state, ",") {
		set, err := tidemark.ParseMariaDBGTIDSet(part)
		if err != nil {
			continue
		}
		for _, h := range set {
			if h.Domain == g.Domain && h.ServerID == g.ServerID && h.Seq >= g.Seq {
				return true
			}
		}
	}
	return false
}

// diverged turns the server's "GTID not in the master's binlog" refusal,
// after following a changed identity, into the error of a lagging replica:
// the checks before streaming (behind) missed it, the server did not.
func (t *Tailer) diverged(res Resolution, err error) error {
	if len(res.Changed) == 0 || !errors.Is(err, tidemark.ErrPositionAhead) {
		return err
	}
	return fmt.Errorf("resume source %s: the new server lacks transactions tidemark already applied (%s): it lagged behind the old primary, and the target holds changes the new primary does not have: stop tidemark and run `tidemark catchup --config …` to re-read every table from it (then `tidemark verify` lists the rows only the old server had as extra in target): %w: %w",
		t.cfg.Name, strings.Join(res.Changed, ", "), err, tidemark.ErrSourceChanged)
}

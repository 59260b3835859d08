package binlog

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"

	"tidemark"
)

// serverChecks are the checks `run` enforces at start (checkServer) and
// `doctor` prints: binlog settings, then the flavor's GTID settings. A
// query that fails is returned as an error (a connection problem, retried by
// the caller), not as a check.
func (t *Tailer) serverChecks(ctx context.Context) ([]tidemark.Check, error) {
	var out []tidemark.Check
	add := func(name string, ok bool, found, fix string) {
		c := tidemark.Check{Name: "source " + name, Status: tidemark.CheckOK, Found: found}
		if !ok {
			c.Status, c.Fix = tidemark.CheckFix, fix
		}
		out = append(out, c)
	}
	r, err := t.query(ctx, "SELECT @@log_bin, @@binlog_format, @@binlog_row_image")
	if err != nil {
		return nil, fmt.Errorf("read binlog settings: %w", err)
	}
	logBin, _ := r.GetInt(0, 0)
	format, _ := r.GetString(0, 1)
	image, _ := r.GetString(0, 2)
	add("log_bin", logBin == 1, map[bool]string{true: "ON", false: "OFF"}[logBin == 1], "enable it (log_bin=mysql-bin)")
	add("binlog_format", strings.EqualFold(format, "ROW"), format, "set binlog_format=ROW")
	add("binlog_row_image", strings.EqualFold(image, "FULL"), image, "set binlog_row_image=FULL")
	r, err = t.query(ctx, "SELECT @@binlog_row_metadata")
	if err != nil {
		var me *mysql.MyError
		if !errors.As(err, &me) {
			return nil, fmt.Errorf("read binlog_row_metadata: %w", err)
		}
		add("binlog_row_metadata", false, "missing", "the server has no binlog_row_metadata (MariaDB ≥ 10.5 or MySQL ≥ 8.0.1 is needed)")
	} else {
		meta, _ := r.GetString(0, 0)
		add("binlog_row_metadata", strings.EqualFold(meta, "FULL"), meta, "set binlog_row_metadata=FULL so column names and the primary key arrive in the table map")
	}
	if t.cfg.Flavor == FlavorMySQL {
		if err := t.checkMySQL(ctx); err != nil {
			if !errors.Is(err, tidemark.ErrSourceConfig) {
				return nil, err
			}
			out = append(out, tidemark.Check{Name: "source MySQL settings", Status: tidemark.CheckFix, Fix: err.Error()})
		}
		return out, nil
	}
	// MariaDB: the GTID settings that failover-following rests on.
	st, err := t.readServer(ctx)
	if err != nil {
		return nil, err
	}
	strict := tidemark.Check{Name: "source gtid_strict_mode", Status: tidemark.CheckOK, Found: onOff(st.strict)}
	if !st.strict {
		// version: gtid orders changes by sequence number, which only
		// strict mode keeps monotonic within a domain.
		strict.Status = tidemark.CheckWarn
		if t.cfg.Version == VersionGTID {
			strict.Status = tidemark.CheckFix
		}
		strict.Fix = "set gtid_strict_mode=ON (SET GLOBAL and in the server's config): version: gtid needs sequence numbers that only grow, and a failover is followed only to a server in strict mode"
	}
	out = append(out, strict)
	slave := tidemark.Check{Name: "source log_slave_updates", Status: tidemark.CheckOK, Found: onOff(st.slaveUpdates)}
	if !st.slaveUpdates {
		slave.Status = tidemark.CheckWarn
		slave.Fix = "set log_slave_updates=ON on this server and its replicas: a replica promoted after a failover can be followed by GTID only if it logged the transactions it replicated"
	}
	out = append(out, slave)
	dom := tidemark.Check{Name: "source GTID domains", Status: tidemark.CheckOK, Found: orNone(st.gtidPos)}
	if err := t.checkDomains(st); err != nil {
		dom.Status, dom.Fix = tidemark.CheckFix, err.Error()
	}
	out = append(out, dom)
	return out, nil
}

func onOff(b bool) string {
	if b {
		return "ON"
	}
	return "OFF"
}

// checkServer verifies the source's settings at start (the checks of
// serverChecks) and names the setting to change.
func (t *Tailer) checkServer(ctx context.Context) error {
	checks, err := t.serverChecks(ctx)
	if err != nil {
		return err
	}
	for _, c := range checks {
		if c.Status == tidemark.CheckFix {
			name := strings.TrimPrefix(c.Name, "source ")
			if c.Found == "" {
				return fmt.Errorf("check source %s: %s: %w", t.cfg.Name, c.Fix, tidemark.ErrSourceConfig)
			}
			return fmt.Errorf("check source %s: %s is %s: %s: %w", t.cfg.Name, name, c.Found, c.Fix, tidemark.ErrSourceConfig)
		}
		if c.Status == tidemark.CheckWarn {
			t.cfg.Logger.Warn("source prerequisite", "source", t.cfg.Name, "check", c.Name, "found", c.Found, "fix", c.Fix)
		}
	}
	return nil
}

// Doctor checks every prerequisite of the source: what checkServer
// enforces at start, and what only matters later — privileges, binlog
// retention against lagBudget (how long tidemark may be stopped or behind
// without losing its position), the time-zone tables, and how the stored
// checkpoint (when there is one) relates to the server (Resolve). It never
// fails: a connection error is a failed check.
func (t *Tailer) Doctor(ctx context.Context, stored *tidemark.Position, lagBudget time.Duration) []tidemark.Check {
	fixed := func(name string, err error) []tidemark.Check {
		fix := "make the source reachable with the configured address and credentials"
		if strings.Contains(err.Error(), "TLS") || strings.Contains(err.Error(), "certificate") {
			fix = "check source.tls (mode, ca_file, server_name) against the server's certificate and TLS settings"
		}
		return []tidemark.Check{{Name: "source " + name, Status: tidemark.CheckFix, Found: redact(err, t.cfg.Password).Error(), Fix: fix}}
	}
	r, err := t.query(ctx, "SELECT VERSION()")
	if err != nil {
		return fixed("connection", err)
	}
	version, _ := r.GetString(0, 0)
	out := []tidemark.Check{{Name: "source connection", Status: tidemark.CheckOK, Found: t.cfg.Addr + " " + version}, t.tlsCheck(ctx)}
	checks, err := t.serverChecks(ctx)
	if err != nil {
		checks = []tidemark.Check{{Name: "source settings", Status: tidemark.CheckFix, Found: redact(err, t.cfg.Password).Error(),
			Fix: "the settings could not be read: see source privileges"}}
	}
	out = append(out, checks...)
	out = append(out, t.privilegeCheck(ctx), t.retentionCheck(ctx, lagBudget), t.zoneCheck(ctx), t.hashCheck(ctx))
	if stored != nil {
		c := tidemark.Check{Name: "source identity vs checkpoint", Status: tidemark.CheckOK, Found: stored.String()}
		res, err := t.Resolve(ctx, *stored)
		switch {
		case err != nil:
			c.Status, c.Fix = tidemark.CheckFix, err.Error()
		case len(res.Changed) > 0:
			c.Status, c.Found, c.Fix = tidemark.CheckWarn, strings.Join(res.Changed, ", "), "none needed: "+res.Note
		}
		out = append(out, c)
	}
	return out
}

// tlsCheck reports the TLS version of the session (the server's
// Ssl_version) and whether the server's certificate was verified (the
// mode: verify-ca and verify-full verify it, require does not).
func (t *Tailer) tlsCheck(ctx context.Context) tidemark.Check {
	c := tidemark.Check{Name: "source TLS", Status: tidemark.CheckOK}
	r, err := t.query(ctx, "SHOW SESSION STATUS LIKE 'Ssl_version'")
	if err != nil {
		c.Status, c.Found, c.Fix = tidemark.CheckFix, err.Error(), "grant the user the right to read its session status"
		return c
	}
	version := ""
	if r.RowNumber() > 0 {
		version, _ = r.GetString(0, 1)
	}
	tc := t.cfg.TLS
	switch {
	case version == "" && tidemark.IsLoopback(t.cfg.Addr):
		c.Found = "off: plain text (mode " + tc.Mode + ", loopback address)"
	case version == "":
		c.Status, c.Found = tidemark.CheckWarn, "off: plain text over the network (mode "+tc.Mode+")"
		c.Fix = "set source.tls (mode verify-full with the server's CA in ca_file): the binlog stream carries every row and the password"
	case tc.Mode == tidemark.TLSVerifyFull:
		name := tc.ServerName
		if name == "" {
			name, _, _ = net.SplitHostPort(t.cfg.Addr)
		}
		c.Found = fmt.Sprintf("%s, certificate verified (verify-full: CA %s, name %s)", version, caName(tc), name)
	case tc.Mode == tidemark.TLSVerifyCA:
		c.Found = fmt.Sprintf("%s, certificate verified (verify-ca: CA %s; its name is not checked)", version, caName(tc))
	default:
		c.Status, c.Found = tidemark.CheckWarn, fmt.Sprintf("%s, certificate not verified (mode %s)", version, tc.Mode)
		c.Fix = "set source.tls.ca_file to the server's CA (mode verify-full) so that a server in the middle is detected"
	}
	return c
}

func caName(tc tidemark.TLSConfig) string {
	if tc.CAFile == "" {
		return "the system's roots"
	}
	return tc.CAFile
}

// privilegeCheck reads the grants of the configured user.
func (t *Tailer) privilegeCheck(ctx context.Context) tidemark.Check {
	c := tidemark.Check{Name: "source privileges", Status: tidemark.CheckOK}
	r, err := t.query(ctx, "SHOW GRANTS FOR CURRENT_USER()")
	if err != nil {
		c.Status, c.Found, c.Fix = tidemark.CheckFix, err.Error(), "grant the user the right to read its own grants (SHOW GRANTS)"
		return c
	}
	var grants []string
	for i := 0; i < r.RowNumber(); i++ {
		g, _ := r.GetString(i, 0)
		grants = append(grants, strings.ToUpper(g))
	}
	all := strings.Join(grants, "\n")
	global := func(priv string) bool {
		for _, g := range grants {
			if strings.Contains(g, " ON *.* ") && (strings.Contains(g, "ALL PRIVILEGES") || strings.Contains(g, priv)) {
				return true
			}
		}
		return false
	}
	need := []string{"REPLICATION SLAVE", "SELECT"}
	if t.cfg.Flavor == FlavorMySQL {
		// the position capture: log_status (BACKUP_ADMIN) or FLUSH TABLES
		// WITH READ LOCK (RELOAD)
		capture := "BACKUP_ADMIN"
		if t.cfg.Capture == CaptureFlushTables {
			capture = "RELOAD"
		}
		need = append(need, "REPLICATION CLIENT", capture)
	}
	var missing []string
	for _, p := range need {
		if !global(p) {
			missing = append(missing, p)
		}
	}
	if t.cfg.Flavor == FlavorMariaDB && !global("BINLOG MONITOR") && !global("REPLICATION CLIENT") && !global("SUPER") {
		missing = append(missing, "BINLOG MONITOR")
	}
	c.Found = fmt.Sprintf("%d grant(s)", len(grants))
	if strings.Contains(all, "ALL PRIVILEGES ON *.*") {
		c.Found = "ALL PRIVILEGES ON *.*"
	}
	if len(missing) > 0 {
		c.Status, c.Found = tidemark.CheckFix, "missing "+strings.Join(missing, ", ")
		c.Fix = fmt.Sprintf("GRANT %s ON *.* TO the tidemark user (SELECT may be limited to the replicated databases)", strings.Join(missing, ", "))
	}
	return c
}

// retentionCheck compares the server's binlog expiry with the lag budget.
func (t *Tailer) retentionCheck(ctx context.Context, budget time.Duration) tidemark.Check {
	c := tidemark.Check{Name: "source binlog retention", Status: tidemark.CheckOK}
	var secs int64
	if r, err := t.query(ctx, "SELECT @@binlog_expire_logs_seconds"); err == nil {
		secs, _ = r.GetInt(0, 0)
	} else if r, err := t.query(ctx, "SELECT CAST(@@expire_logs_days * 86400 AS SIGNED)"); err == nil {
		secs, _ = r.GetInt(0, 0)
	} else {
		c.Status, c.Found, c.Fix = tidemark.CheckWarn, err.Error(), "could not read the binlog expiry"
		return c
	}
	expire := time.Duration(secs) * time.Second
	switch {
	case expire == 0:
		c.Found = "binlogs never expire by age"
	case expire < budget:
		c.Status, c.Found = tidemark.CheckFix, fmt.Sprintf("expire %s < lag budget %s", expire, budget)
		c.Fix = fmt.Sprintf("keep binlogs at least as long as tidemark may be stopped or behind: SET GLOBAL binlog_expire_logs_seconds = %d (and in the server's config), or lower source.lag_budget; a purged position needs a catch-up (fallback)", int64(budget/time.Second))
	default:
		c.Found = fmt.Sprintf("expire %s ≥ lag budget %s", expire, budget)
	}
	return c
}

// hashCheck runs the row and key hash the keydiff fallback and `tidemark
// verify` compute on the source (SHA2(…, 256), see keyHashMy and
// vRowHashHex) and compares it with the same hash computed here: a server
// without it (MD5() is gone from MySQL 9.6, and SHA2() is NULL on a server
// built without TLS) would fail those mid-run.
func (t *Tailer) hashCheck(ctx context.Context) tidemark.Check {
	const probe = "tidemark|1:a"
	sum := sha256.Sum256([]byte(probe))
	want := hex.EncodeToString(sum[:])
	c := tidemark.Check{Name: "source row hash (SHA2)", Status: tidemark.CheckOK, Found: "SHA2(…, 256) matches"}
	r, err := t.query(ctx, "SELECT SHA2(?, 256)", probe)
	var got string
	if err == nil {
		got, _ = r.GetString(0, 0)
	}
	if err != nil || got != want {
		found := "SHA2('" + probe + "', 256) = '" + got + "'"
		if err != nil {
			found = redact(err, t.cfg.Password).Error()
		}
		c.Status, c.Found = tidemark.CheckFix, found
		c.Fix = "delete_detection: keydiff and tidemark verify hash rows with SHA2(…, 256) on the source; use a server build that has SHA2 (MariaDB 10.x, MySQL 8.0+ with TLS support)"
	}
	return c
}

// zoneCheck reports whether the server knows the configured zone by name.
// tidemark converts times itself and does not need the server's
// time-zone tables; applications that SET time_zone to a named zone do.
func (t *Tailer) zoneCheck(ctx context.Context) tidemark.Check {
	zone := t.cfg.Zone.Location.String()
	c := tidemark.Check{Name: "source time-zone tables", Status: tidemark.CheckOK, Found: zone + " known"}
	r, err := t.query(ctx, "SELECT CONVERT_TZ('2026-01-01 00:00:00', 'UTC', ?) IS NOT NULL", zone)
	if err != nil {
		c.Status, c.Found, c.Fix = tidemark.CheckWarn, err.Error(), "could not query the time-zone tables"
		return c
	}
	if ok, _ := r.GetInt(0, 0); ok != 1 {
		c.Status, c.Found = tidemark.CheckWarn, zone+" unknown to the server"
		c.Fix = "load the time-zone tables (mariadb-tzinfo-to-sql /usr/share/zoneinfo | mariadb mysql); tidemark converts DATETIME itself, but applications that SET time_zone = '" + zone + "' write wrong times without them"
	}
	return c
}

package postgres

import (
	"context"
	"fmt"
	"net"
	"strings"

	"tidemark"
)

// Doctor checks what the sink needs of the target (for `tidemark
// doctor`): a connection, and the right to create or use the control schema
// (the checkpoint store's) and the target schema (or, without a target schema, new schemas named
// after the source databases). It creates nothing: open the sink with
// Config.SkipInit. It never fails: a connection error is a failed check.
func (s *Sink) Doctor(ctx context.Context) []tidemark.Check {
	controlSchema := s.cfg.Checkpoints.Schema()
	var version, user, db string
	err := s.pool.QueryRow(ctx, "SELECT current_setting('server_version'), current_user, current_database()").Scan(&version, &user, &db)
	if err != nil {
		return []tidemark.Check{{Name: "target connection", Status: tidemark.CheckFix, Found: redact(err, s.secret).Error(),
			Fix: "make PostgreSQL reachable with target.postgres.dsn"}}
	}
	out := []tidemark.Check{{Name: "target connection", Status: tidemark.CheckOK, Found: fmt.Sprintf("PostgreSQL %s, database %s as %s", version, db, user)}, s.tlsCheck(ctx)}
	schemas := []string{controlSchema}
	if s.cfg.TargetSchema != "" && s.cfg.TargetSchema != controlSchema {
		schemas = append(schemas, s.cfg.TargetSchema)
	}
	var dbCreate bool
	if err := s.pool.QueryRow(ctx, "SELECT has_database_privilege(current_database(), 'CREATE')").Scan(&dbCreate); err != nil {
		return append(out, tidemark.Check{Name: "target privileges", Status: tidemark.CheckFix, Found: redact(err, s.secret).Error(), Fix: "could not read privileges"})
	}
	for _, schema := range schemas {
		c := tidemark.Check{Name: "target schema " + schema, Status: tidemark.CheckOK}
		var exists, usage, create bool
		err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1),
			COALESCE((SELECT has_schema_privilege(oid, 'USAGE') FROM pg_namespace WHERE nspname = $1), false),
			COALESCE((SELECT has_schema_privilege(oid, 'CREATE') FROM pg_namespace WHERE nspname = $1), false)`, schema).Scan(&exists, &usage, &create)
		switch {
		case err != nil:
			c.Status, c.Found, c.Fix = tidemark.CheckFix, redact(err, s.secret).Error(), "could not read privileges"
		case exists && usage && create:
			c.Found = "exists; USAGE and CREATE granted"
		case exists:
			c.Status, c.Found = tidemark.CheckFix, fmt.Sprintf("exists; USAGE %v, CREATE %v", usage, create)
			c.Fix = fmt.Sprintf("GRANT USAGE, CREATE ON SCHEMA %s TO %s", tidemark.QuotePostgres(schema), tidemark.QuotePostgres(user))
		case dbCreate:
			c.Found = "missing; will be created (CREATE on the database granted)"
		default:
			c.Status, c.Found = tidemark.CheckFix, "missing, and no CREATE on the database"
			c.Fix = fmt.Sprintf("CREATE SCHEMA %s AUTHORIZATION %s (or GRANT CREATE ON DATABASE %s TO %s)", tidemark.QuotePostgres(schema), tidemark.QuotePostgres(user), tidemark.QuotePostgres(db), tidemark.QuotePostgres(user))
		}
		out = append(out, c)
	}
	if s.cfg.TargetSchema == "" {
		c := tidemark.Check{Name: "target schemas per source database", Status: tidemark.CheckOK, Found: "CREATE on the database granted"}
		if !dbCreate {
			c.Status, c.Found = tidemark.CheckWarn, "no CREATE on the database"
			c.Fix = fmt.Sprintf("tables go to a schema named after each source database: create those schemas for %s, or GRANT CREATE ON DATABASE %s TO %s, or set target.postgres.schema", tidemark.QuotePostgres(user), tidemark.QuotePostgres(db), tidemark.QuotePostgres(user))
		}
		out = append(out, c)
	}
	return out
}

// tlsCheck reports the TLS version of a session (pg_stat_ssl) and whether
// the server's certificate is verified (the DSN's sslmode, as pgx applies
// it: verify-full checks chain and name, verify-ca — or require with
// sslrootcert — the chain only).
func (s *Sink) tlsCheck(ctx context.Context) tidemark.Check {
	c := tidemark.Check{Name: "target TLS", Status: tidemark.CheckOK}
	var on bool
	var version string
	err := s.pool.QueryRow(ctx, "SELECT ssl, COALESCE(version, '') FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&on, &version)
	switch {
	case err != nil:
		c.Status, c.Found, c.Fix = tidemark.CheckFix, redact(err, s.secret).Error(), "could not read pg_stat_ssl"
	case !on && (strings.HasPrefix(s.host, "/") || tidemark.IsLoopback(net.JoinHostPort(s.host, "0"))):
		c.Found = "off: plain text (loopback address or local socket)"
	case !on:
		c.Status, c.Found = tidemark.CheckWarn, "off: plain text over the network"
		c.Fix = "set sslmode=verify-full and sslrootcert in target.postgres.dsn"
	case s.tlsVerify == "":
		c.Status, c.Found = tidemark.CheckWarn, version+", certificate not verified (sslmode require or prefer)"
		c.Fix = "set sslmode=verify-full and sslrootcert in target.postgres.dsn so that a server in the middle is detected"
	default:
		c.Found = version + ", certificate verified (" + s.tlsVerify + ")"
	}
	return c
}

package harness

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// I5 (docs/RELIABILITY.md): no older version of a row is applied after a
// newer one. The evidence is a trigger on the target tables: it records,
// in <schema>.rel_i5, every UPDATE that lowers (_tm_seq, _tm_idx) and every
// INSERT of a key whose deleted version (kept in <schema>.rel_i5_tomb) is
// newer. The trigger's arguments name the key columns.

// I5SetupSQL creates, in schema, the tables the I5 trigger records into
// and its function (idempotent).
func I5SetupSQL(schema string) string {
	return fmt.Sprintf(`
CREATE SCHEMA IF NOT EXISTS %[1]s;
CREATE TABLE IF NOT EXISTS %[1]s.rel_i5 (tbl text, key text, kind text, old_seq bigint, old_idx int, new_seq bigint, new_idx int, at timestamptz DEFAULT clock_timestamp());
CREATE TABLE IF NOT EXISTS %[1]s.rel_i5_tomb (tbl text, key text, seq bigint, idx int, PRIMARY KEY (tbl, key));
CREATE OR REPLACE FUNCTION %[1]s.rel_i5_row() RETURNS trigger LANGUAGE plpgsql AS $f$
DECLARE k text := ''; j jsonb; tomb record;
BEGIN
  IF TG_OP = 'DELETE' THEN j := to_jsonb(OLD); ELSE j := to_jsonb(NEW); END IF;
  FOR i IN 0 .. TG_NARGS - 1 LOOP
    IF i > 0 THEN k := k || '|'; END IF;
    k := k || coalesce(j ->> TG_ARGV[i], '');
  END LOOP;
  IF TG_OP = 'UPDATE' THEN
    IF (NEW._tm_seq, NEW._tm_idx) < (OLD._tm_seq, OLD._tm_idx) THEN
      INSERT INTO %[1]s.rel_i5 VALUES (TG_TABLE_NAME, k, 'update regressed', OLD._tm_seq, OLD._tm_idx, NEW._tm_seq, NEW._tm_idx);
    END IF;
    RETURN NEW;
  ELSIF TG_OP = 'DELETE' THEN
    INSERT INTO %[1]s.rel_i5_tomb VALUES (TG_TABLE_NAME, k, OLD._tm_seq, OLD._tm_idx)
      ON CONFLICT (tbl, key) DO UPDATE SET seq = EXCLUDED.seq, idx = EXCLUDED.idx;
    RETURN OLD;
  ELSE
    SELECT * INTO tomb FROM %[1]s.rel_i5_tomb WHERE tbl = TG_TABLE_NAME AND key = k;
    IF FOUND AND (NEW._tm_seq, NEW._tm_idx) < (tomb.seq, tomb.idx) THEN
      INSERT INTO %[1]s.rel_i5 VALUES (TG_TABLE_NAME, k, 'insert after newer delete', tomb.seq, tomb.idx, NEW._tm_seq, NEW._tm_idx);
    END IF;
    RETURN NEW;
  END IF;
END $f$;
`, pgx.Identifier{schema}.Sanitize())
}

// I5InstallSQL puts the I5 trigger on an existing target table, keyed by
// the key columns.
func I5InstallSQL(schema, table string, key ...string) string {
	args := make([]string, len(key))
	for i, k := range key {
		args[i] = "'" + strings.ReplaceAll(k, "'", "''") + "'"
	}
	return fmt.Sprintf(`DROP TRIGGER IF EXISTS rel_i5 ON %[1]s;
CREATE TRIGGER rel_i5 BEFORE INSERT OR UPDATE OR DELETE ON %[1]s FOR EACH ROW EXECUTE FUNCTION %[2]s.rel_i5_row(%[3]s);`,
		pgx.Identifier{schema, table}.Sanitize(), pgx.Identifier{schema}.Sanitize(), strings.Join(args, ", "))
}

// I5WatchSQL puts the I5 trigger on every table created in schema from now
// on that has tidemark's version columns (an event trigger named
// eventTrigger on CREATE TABLE, keyed by the table's primary key), so that
// I5 also watches the first snapshot or the first rows streamed. A table
// created without its primary key (a first run's fresh load, which builds
// the key after its rows: sink/postgres keyafter.go) gets the trigger at
// the ALTER TABLE that adds the key; the load before it is inserts of one
// version, where I5 has nothing to catch. Drop the event trigger (a
// database-wide object) when done.
func I5WatchSQL(schema, eventTrigger string) string {
	return fmt.Sprintf(`
CREATE OR REPLACE FUNCTION %[1]s.rel_i5_attach() RETURNS event_trigger LANGUAGE plpgsql AS $f$
DECLARE obj record; cols text;
BEGIN
  FOR obj IN SELECT * FROM pg_event_trigger_ddl_commands() WHERE command_tag IN ('CREATE TABLE', 'ALTER TABLE') AND object_type = 'table' AND schema_name = %[2]s LOOP
    IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = obj.objid AND attname = '_tm_seq' AND NOT attisdropped) THEN
      CONTINUE;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = obj.objid AND tgname = 'rel_i5') THEN
      CONTINUE;
    END IF;
    SELECT string_agg(quote_literal(a.attname), ', ' ORDER BY array_position(i.indkey::int2[], a.attnum)) INTO cols
      FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey::int2[])
      WHERE i.indrelid = obj.objid AND i.indisprimary;
    IF cols IS NOT NULL THEN
      EXECUTE format('CREATE TRIGGER rel_i5 BEFORE INSERT OR UPDATE OR DELETE ON %%s FOR EACH ROW EXECUTE FUNCTION %%I.rel_i5_row(%%s)', obj.object_identity, %[2]s, cols);
    END IF;
  END LOOP;
END $f$;
DROP EVENT TRIGGER IF EXISTS %[3]s;
CREATE EVENT TRIGGER %[3]s ON ddl_command_end WHEN TAG IN ('CREATE TABLE', 'ALTER TABLE') EXECUTE FUNCTION %[1]s.rel_i5_attach();
`, pgx.Identifier{schema}.Sanitize(), "'"+strings.ReplaceAll(schema, "'", "''")+"'", pgx.Identifier{eventTrigger}.Sanitize())
}

// ReadI5 returns what the I5 trigger recorded in schema: the regressions,
// the inserts after a newer delete (resurrections), and up to 10 of them
// described (resurrections only when !allowResurrect).
func ReadI5(ctx context.Context, pg *pgx.Conn, schema string, allowResurrect bool) (regressions, resurrections int, bad []string, err error) {
	rows, err := pg.Query(ctx, fmt.Sprintf("SELECT tbl, key, kind, old_seq, old_idx, new_seq, new_idx FROM %s.rel_i5 ORDER BY at", pgx.Identifier{schema}.Sanitize()))
	if err != nil {
		return 0, 0, nil, fmt.Errorf("read I5 records: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var tbl, key, kind string
		var os, ns int64
		var oi, ni int32
		if err := rows.Scan(&tbl, &key, &kind, &os, &oi, &ns, &ni); err != nil {
			return 0, 0, nil, fmt.Errorf("read I5 records: %w", err)
		}
		if kind == "insert after newer delete" {
			resurrections++
			if allowResurrect {
				continue
			}
		} else {
			regressions++
		}
		if len(bad) < 10 {
			bad = append(bad, fmt.Sprintf("%s %s: %s: version %d/%d then %d/%d", tbl, key, kind, os, oi, ns, ni))
		}
	}
	return regressions, resurrections, bad, rows.Err()
}

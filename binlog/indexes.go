package binlog

import (
	"context"
	"fmt"
	"strings"

	"github.com/go-mysql-org/go-mysql/mysql"

	"tidemark"
)

// Secondary indexes are read from information_schema.STATISTICS (the
// binlog's table map carries only the primary key). The Reader lists them
// for a snapshot; the Tailer reads them again after every ALTER TABLE,
// CREATE INDEX and DROP INDEX of an included table and sends them with the
// DDL event (tidemark.DDLEvent.Indexes).

const indexesSQL = `SELECT INDEX_NAME, NON_UNIQUE, COLUMN_NAME, SUB_PART, COLLATION, INDEX_TYPE
	FROM information_schema.STATISTICS
	WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND INDEX_NAME <> 'PRIMARY'
	ORDER BY INDEX_NAME, SEQ_IN_INDEX`

// readIndexes returns the secondary indexes of a table as the source's
// catalog holds them now (none when the table does not exist).
func (t *Tailer) readIndexes(ctx context.Context, id tidemark.TableID) ([]tidemark.Index, error) {
	var r *mysql.Result
	err := tidemark.Retry(ctx, "read indexes of "+id.String(), queryRetry, isTransient, t.rl, func(ctx context.Context) error {
		var err error
		t.stats.SchemaReads.Add(1)
		r, err = t.query(ctx, indexesSQL, id.Database, id.Name)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read indexes of %s: %w", id, err)
	}
	var out []tidemark.Index
	for i := 0; i < r.RowNumber(); i++ {
		name, _ := r.GetString(i, 0)
		nonUnique, _ := r.GetInt(i, 1)
		col, _ := r.GetString(i, 2)
		sub, _ := r.GetInt(i, 3)
		coll, _ := r.GetString(i, 4)
		typ, _ := r.GetString(i, 5)
		if n := len(out); n == 0 || out[n-1].Name != name {
			out = append(out, tidemark.Index{Name: name, Unique: nonUnique == 0, Type: strings.ToUpper(typ)})
		}
		ix := &out[len(out)-1]
		ix.Columns = append(ix.Columns, tidemark.IndexColumn{Name: col, Prefix: int(sub), Desc: coll == "D"})
	}
	return out, nil
}

var _ tidemark.IndexLister = (*Reader)(nil)

// Indexes implements tidemark.IndexLister.
func (r *Reader) Indexes(ctx context.Context, id tidemark.TableID) ([]tidemark.Index, error) {
	return r.t.readIndexes(ctx, id)
}

// uniqueColumns returns the (lower-cased) names of the columns that are
// part of a unique index.
func uniqueColumns(idx []tidemark.Index) map[string]bool {
	var out map[string]bool
	for _, ix := range idx {
		if !ix.Unique {
			continue
		}
		for _, c := range ix.Columns {
			if out == nil {
				out = map[string]bool{}
			}
			out[strings.ToLower(c.Name)] = true
		}
	}
	return out
}

package binlog

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"

	"tidemark"
)

// tableInfo is a decoded table-map event: the tidemark schema and one
// converter per column.
type tableInfo struct {
	table *tidemark.Table
	conv  []converter
	// keep holds the row-image positions of table.Columns when columns are
	// excluded (exclude_columns); nil means every position, in order.
	keep []int
	// skip is true for tables outside the include filter and for tables
	// whose rows cannot be decoded (err set).
	skip bool
	// err says why the rows of an included table cannot be decoded; the
	// table is reported once (DDLUndecodable) and quarantined.
	err      error
	id       tidemark.TableID
	reported bool
}

const collationBinary = 63

var latin1Collations = map[uint64]bool{5: true, 8: true, 15: true, 31: true, 47: true, 48: true, 49: true, 94: true}

// realType returns the column's real type: ENUM and SET are logged as
// MYSQL_TYPE_STRING with the real type in the metadata's high byte.
func realType(tm *replication.TableMapEvent, i int) (typ byte, meta uint16) {
	typ, meta = tm.ColumnType[i], tm.ColumnMeta[i]
	if typ == mysql.MYSQL_TYPE_STRING && meta >= 256 {
		b0 := byte(meta >> 8)
		switch b0 {
		case mysql.MYSQL_TYPE_ENUM, mysql.MYSQL_TYPE_SET:
			return b0, meta
		}
		if b0&0x30 != 0x30 { // long CHAR: length bits folded into b0
			return mysql.MYSQL_TYPE_STRING, meta
		}
		return b0, meta
	}
	return typ, meta
}

// stringLength returns the byte length of a MYSQL_TYPE_STRING column from
// its table-map metadata (lengths past 255 fold two bits into the type
// byte; go-mysql's decodeString reads it the same way).
func stringLength(meta uint16) int {
	if meta < 256 {
		return int(meta)
	}
	b0, b1 := byte(meta>>8), byte(meta&0xff)
	if b0&0x30 != 0x30 {
		return int(uint16(b1) | uint16((b0&0x30)^0x30)<<4)
	}
	return int(b1)
}

// tableMapKey identifies a table-map event's layout, so that an unchanged
// table reuses its decoded info across transactions.
func tableMapKey(tm *replication.TableMapEvent) string {
	var b strings.Builder
	b.Grow(64 + len(tm.ColumnType)*4)
	b.WriteString(strconv.FormatUint(tm.TableID, 10))
	b.WriteByte('|')
	b.Write(tm.Schema)
	b.WriteByte('.')
	b.Write(tm.Table)
	b.WriteByte('|')
	b.Write(tm.ColumnType)
	for _, m := range tm.ColumnMeta {
		b.WriteString(strconv.Itoa(int(m)))
		b.WriteByte(',')
	}
	for _, n := range tm.ColumnName {
		b.Write(n)
		b.WriteByte(0)
	}
	return b.String()
}

// buildTable turns a table-map event into a tableInfo. jsonCols names the
// columns the source declares JSON (MariaDB's LONGTEXT + json_valid check,
// which the binlog cannot tell from LONGTEXT); jsonKnown (nil: all) the
// columns whose JSON-ness is known, a LONGTEXT column not among them is
// text marked JSONUnknown; uniqueCols the columns of its unique indexes
// (lower case).
func (t *Tailer) buildTable(tm *replication.TableMapEvent, jsonCols, jsonKnown, uniqueCols map[string]bool) (*tableInfo, error) {
	id := tidemark.TableID{Database: string(tm.Schema), Name: string(tm.Table)}
	if !t.cfg.included(id.Database, id.Name) {
		return &tableInfo{skip: true}, nil
	}
	n := int(tm.ColumnCount)
	names := tm.ColumnNameString()
	if len(names) != n {
		return nil, fmt.Errorf("decode table map of %s: the server sent no column names: set binlog_row_metadata=FULL on the source: %w", id, tidemark.ErrSourceConfig)
	}
	if err := tidemark.CheckIdentifier("database", id.Database); err != nil {
		return nil, fmt.Errorf("decode table map of %s: %w", id, err)
	}
	if err := tidemark.CheckIdentifier("table", id.Name); err != nil {
		return nil, fmt.Errorf("decode table map of %s: %w", id, err)
	}
	unsigned := tm.UnsignedMap()
	collations := tm.CollationMap()
	enums := tm.EnumStrValueMap()
	sets := tm.SetStrValueMap()
	enumSetColls := tm.EnumSetCollationMap()
	// members decodes ENUM/SET member names from the column's character
	// set (the table map carries them as the column stores them).
	members := func(name string, i int, raw []string) ([]string, error) {
		dec, err := t.decoderFor(id, name, enumSetColls[i])
		if err != nil || dec == nil || raw == nil {
			return raw, err
		}
		out := make([]string, len(raw))
		for j, m := range raw {
			if out[j], err = dec(m); err != nil {
				return nil, fmt.Errorf("decode table map of %s: column %s: member %d: %w", id, name, j+1, err)
			}
		}
		return out, nil
	}

	tbl := &tidemark.Table{ID: id, Columns: make([]tidemark.Column, 0, n)}
	info := &tableInfo{table: tbl, conv: make([]converter, 0, n), id: id}
	excluded := t.cfg.excludedColumns(id)
	// Key positions in the row image (before exclusion).
	var imageKey []int
	keyNames := map[string]bool{}
	if cols, ok := t.cfg.BusinessKeys[id.String()]; ok {
		for _, c := range cols {
			keyNames[strings.ToLower(c)] = true
		}
	} else {
		for _, k := range tm.PrimaryKey {
			if int(k) >= n {
				return nil, fmt.Errorf("decode table map of %s: primary key column index %d out of range", id, k)
			}
			imageKey = append(imageKey, int(k))
			keyNames[strings.ToLower(names[k])] = true
		}
	}
	for i := 0; i < n; i++ {
		name := names[i]
		if excluded[strings.ToLower(name)] {
			if keyNames[strings.ToLower(name)] {
				return nil, fmt.Errorf("decode table map of %s: exclude_columns: %s is a key column and cannot be excluded", id, name)
			}
			if info.keep == nil {
				info.keep = make([]int, 0, n)
				for j := 0; j < i; j++ {
					info.keep = append(info.keep, j)
				}
			}
			continue
		}
		if info.keep != nil {
			info.keep = append(info.keep, i)
		}
		if err := tidemark.CheckIdentifier("column of "+id.String(), name); err != nil {
			return nil, fmt.Errorf("decode table map of %s: %w", id, err)
		}
		env := &valueEnv{table: id, column: name, zone: t.cfg.zoneFor(id, name), zeroDates: t.cfg.ZeroDates, stats: &t.stats, span: new(tidemark.ZoneSpan), injective: injective(keyNames[strings.ToLower(name)], uniqueCols[strings.ToLower(name)])}
		col := tidemark.Column{Name: name, Nullable: true}
		if avail, nullable := tm.Nullable(i); avail {
			col.Nullable = nullable
		}
		typ, meta := realType(tm, i)
		coll, known := collations[i]
		isText := typ == mysql.MYSQL_TYPE_VARCHAR || typ == mysql.MYSQL_TYPE_VAR_STRING || typ == mysql.MYSQL_TYPE_STRING || typ == mysql.MYSQL_TYPE_BLOB
		if isText && !jsonCols[name] && !known && typ == mysql.MYSQL_TYPE_BLOB {
			return nil, fmt.Errorf("decode table map of %s: column %s: no character set in the table map (set binlog_row_metadata=FULL): %w", id, name, tidemark.ErrSourceConfig)
		}
		var ok bool
		col.Kind, col.Bits, ok = kindOf(mysqlType{
			dataType: tableMapType(typ),
			unsigned: unsigned[i],
			binary:   isText && known && coll == collationBinary,
			json:     isText && jsonCols[name],
		})
		if !ok {
			return nil, fmt.Errorf("decode table map of %s: column %s: unsupported MySQL type %d", id, name, typ)
		}
		if _, known := jsonKnown[name]; jsonKnown != nil && !known && col.Kind == tidemark.KindText && typ == mysql.MYSQL_TYPE_BLOB && meta == 4 {
			// A LONGTEXT this process never saw listed: JSON or not,
			// the source no longer says (jsonKnown).
			col.JSONUnknown = true
		}
		conv := env.convFor(col.Kind)
		switch col.Kind {
		case tidemark.KindDecimal:
			col.Precision, col.Scale = int(meta>>8), int(meta&0xff)
		case tidemark.KindBit:
			col.Bits = int(meta>>8)*8 + int(meta&0xff)
		case tidemark.KindTime:
			if typ == mysql.MYSQL_TYPE_TIME2 {
				col.Scale = int(meta)
			}
		case tidemark.KindDateTime:
			if typ == mysql.MYSQL_TYPE_DATETIME2 {
				col.Scale = int(meta)
			}
		case tidemark.KindTimestamp:
			if typ == mysql.MYSQL_TYPE_TIMESTAMP2 {
				col.Scale = int(meta)
			}
		case tidemark.KindEnum, tidemark.KindSet:
			raw := enums[i]
			if col.Kind == tidemark.KindSet {
				raw = sets[i]
			}
			names, err := members(name, i, raw)
			if err != nil {
				return nil, err
			}
			if col.Kind == tidemark.KindEnum {
				conv = env.convEnum(names)
			} else {
				conv = env.convSet(names)
			}
		case tidemark.KindBytes:
			if typ == mysql.MYSQL_TYPE_STRING {
				// BINARY(n): the binlog drops the trailing 0x00 pad
				// bytes (the server's Field_string::pack), the column
				// holds them.
				conv = env.convBinary(stringLength(meta))
			}
		}
		if conv == nil { // text, decoded from its character set
			dec, err := t.decoderFor(id, name, coll)
			if err != nil {
				return nil, err
			}
			conv = env.convText(dec)
		}
		tbl.Columns = append(tbl.Columns, col)
		info.conv = append(info.conv, conv)
	}
	// Business key: configured, else the primary key from the metadata.
	if cols, ok := t.cfg.BusinessKeys[id.String()]; ok {
		for _, c := range cols {
			k := tbl.ColumnIndex(c)
			if k < 0 {
				return nil, fmt.Errorf("decode table map of %s: business_keys: column %q not in table", id, c)
			}
			tbl.Key = append(tbl.Key, k)
		}
	} else {
		for _, k := range imageKey {
			tbl.Key = append(tbl.Key, tbl.ColumnIndex(names[k]))
		}
		if len(tbl.Key) == 0 {
			return nil, fmt.Errorf("decode table map of %s: table has no primary key in the binlog metadata (needs binlog_row_metadata=FULL and a primary key, or configure business_keys for it)", id)
		}
	}
	return info, nil
}

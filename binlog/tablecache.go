package binlog

import (
	lru "github.com/hashicorp/golang-lru/v2/simplelru"

	"tidemark"
)

// The decoded table maps are cached per table: each table keeps its last
// few layouts (a layout changes only with a schema change, or with a new
// table id when the server reopens the table), and the tables themselves
// are held in an LRU large enough for any real schema. A source with more
// active tables than a flat layout cache could hold therefore reads each
// table's schema once, not again at every table map (review finding 19:
// the old map of 4,096 layouts was cleared when full, and 10,000 active
// tables turned into a stream of information_schema queries).
const (
	maxCachedTables    = 1 << 16
	maxLayoutsPerTable = 4
)

// tableLayouts are the decoded layouts of one table, oldest first.
type tableLayouts struct {
	keys  []string
	infos []*tableInfo
}

// layoutCache maps table-map layouts (tableMapKey) to decoded tables.
// Streaming goroutine only.
type layoutCache struct {
	tables *lru.LRU[tidemark.TableID, *tableLayouts]
}

func newLayoutCache(size int) *layoutCache {
	c, err := lru.NewLRU[tidemark.TableID, *tableLayouts](size, nil)
	if err != nil {
		panic(err) // size > 0 is a constant
	}
	return &layoutCache{tables: c}
}

func (c *layoutCache) get(id tidemark.TableID, key string) (*tableInfo, bool) {
	l, ok := c.tables.Get(id)
	if !ok {
		return nil, false
	}
	for i, k := range l.keys {
		if k == key {
			return l.infos[i], true
		}
	}
	return nil, false
}

func (c *layoutCache) put(id tidemark.TableID, key string, ti *tableInfo) {
	l, ok := c.tables.Get(id)
	if !ok {
		l = &tableLayouts{}
		c.tables.Add(id, l)
	}
	if len(l.keys) >= maxLayoutsPerTable {
		l.keys, l.infos = l.keys[1:], l.infos[1:]
	}
	l.keys = append(l.keys, key)
	l.infos = append(l.infos, ti)
}

// drop forgets every layout of a table.
func (c *layoutCache) drop(id tidemark.TableID) { c.tables.Remove(id) }

package tidemark

import (
	"fmt"
	"testing"
)

// TestMergeWaiting: chunks already waiting are appended in order, the
// merged chunk keeps the last commit position, a chunk with DDL is handed
// back unmerged, and nothing is taken beyond it or past mergeMax.
func TestMergeWaiting(t *testing.T) {
	chg := func(n int) []Change { return []Change{{Version: Version{Seq: uint64(n), Index: 1}}} }
	pos := func(n int) Position { return Position{GTID: fmt.Sprintf("0-1-%d", n)} }
	chunks := make(chan Chunk, 8)
	chunks <- Chunk{Changes: chg(2)}                                              // a transaction's first part
	chunks <- Chunk{Changes: chg(3), Commit: pos(3), Watermarks: []Watermark{{}}} // its end
	chunks <- Chunk{Changes: chg(4)}                                              // the next one, continuing
	chunks <- Chunk{DDL: []DDLEvent{{Op: DDLAlterTable}}, Commit: pos(5)}         // a schema change
	chunks <- Chunk{Changes: chg(6), Commit: pos(6)}
	ch := Chunk{Changes: chg(1), Commit: pos(1)}
	carry := mergeWaiting(&ch, chunks)
	var seqs []uint64
	for _, c := range ch.Changes {
		seqs = append(seqs, c.Version.Seq)
	}
	if fmt.Sprint(seqs) != "[1 2 3 4]" || ch.Commit != pos(3) || len(ch.Watermarks) != 1 {
		t.Fatalf("merged %v commit %v watermarks %d; want [1 2 3 4], %v, 1", seqs, ch.Commit, len(ch.Watermarks), pos(3))
	}
	if carry == nil || len(carry.DDL) != 1 || len(chunks) != 1 {
		t.Fatalf("the DDL chunk was not handed back alone (carry %+v, %d left)", carry, len(chunks))
	}
	// A DDL chunk takes nothing after it; a full chunk takes nothing more.
	if mergeWaiting(carry, chunks) != nil || len(chunks) != 1 {
		t.Fatal("a chunk with DDL merged what follows it")
	}
	big := Chunk{Changes: make([]Change, mergeMax)}
	if mergeWaiting(&big, chunks); len(big.Changes) != mergeMax || len(chunks) != 1 {
		t.Fatal("merged past mergeMax")
	}
	// Nothing waiting, or a closed channel: returns at once.
	<-chunks
	one := Chunk{Changes: chg(7)}
	if mergeWaiting(&one, chunks) != nil || len(one.Changes) != 1 {
		t.Fatal("empty channel")
	}
	close(chunks)
	if mergeWaiting(&one, chunks) != nil || len(one.Changes) != 1 {
		t.Fatal("closed channel")
	}
}

package tidemark

import (
	"fmt"
	"testing"
)

// TestMergeWaiting: chunks already waiting are appended in order and the
// merged chunk carries the last piece's commit position; the first part of
// a transaction is not merged after a chunk that ended one, a chunk with DDL
// is handed back unmerged, and nothing is taken past mergeMax.
func TestMergeWaiting(t *testing.T) {
	chg := func(n int) []Change { return []Change{{Version: Version{Seq: uint64(n), Index: 1}}} }
	pos := func(n int) Position { return Position{GTID: fmt.Sprintf("0-1-%d", n)} }
	seqs := func(ch Chunk) string {
		var s []uint64
		for _, c := range ch.Changes {
			s = append(s, c.Version.Seq)
		}
		return fmt.Sprint(s)
	}
	chunks := make(chan Chunk, 8)
	chunks <- Chunk{Changes: chg(2), Commit: pos(2)}                              // a whole transaction
	chunks <- Chunk{Changes: chg(3), Commit: pos(3), Watermarks: []Watermark{{}}} // another
	chunks <- Chunk{Changes: chg(4)}                                              // a transaction's first part
	chunks <- Chunk{Changes: chg(5), Commit: pos(5)}                              // its end
	chunks <- Chunk{DDL: []DDLEvent{{Op: DDLAlterTable}}, Commit: pos(6)}         // a schema change
	chunks <- Chunk{Changes: chg(7), Commit: pos(7)}

	ch := Chunk{Changes: chg(1), Commit: pos(1)}
	carry := mergeWaiting(&ch, chunks)
	if seqs(ch) != "[1 2 3]" || ch.Commit != pos(3) || len(ch.Watermarks) != 1 {
		t.Fatalf("merged %v commit %v watermarks %d; want [1 2 3], %v, 1", seqs(ch), ch.Commit, len(ch.Watermarks), pos(3))
	}
	if carry == nil || seqs(*carry) != "[4]" || !carry.Commit.IsZero() {
		t.Fatalf("the next transaction's first part was not handed back: %+v", carry)
	}
	part := *carry
	carry = mergeWaiting(&part, chunks)
	if seqs(part) != "[4 5]" || part.Commit != pos(5) {
		t.Fatalf("a transaction's parts merged to %v commit %v; want [4 5], %v", seqs(part), part.Commit, pos(5))
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
	one := Chunk{Changes: chg(8)}
	if mergeWaiting(&one, chunks) != nil || len(one.Changes) != 1 {
		t.Fatal("empty channel")
	}
	close(chunks)
	if mergeWaiting(&one, chunks) != nil || len(one.Changes) != 1 {
		t.Fatal("closed channel")
	}
}

package kafka

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"tidemark"
)

// BenchmarkExactlyOnceVsAtLeastOnce publishes the same batches (5000
// updates each, the pipeline's default batch size, and 100 to show the
// fixed cost of a transaction) with the transactional
// producer and with the idempotent at-least-once producer, interleaved in
// one run on one in-process cluster, and reports the throughput of each and
// their ratio (eos/alo; the goal is ≥ 0.9). The cluster discards the record
// bytes (kfake.BlackholeProduce) so that its storage does not dilute the
// difference; sequence numbers and transactions are still checked.
//
//	go test -run '^$' -bench ExactlyOnceVsAtLeastOnce -benchtime 200x ./sink/kafka/
func BenchmarkExactlyOnceVsAtLeastOnce(b *testing.B) {
	for _, n := range []int{5000, 100} {
		b.Run(fmt.Sprintf("batch=%d", n), func(b *testing.B) { benchmarkDelivery(b, n) })
	}
}

func benchmarkDelivery(b *testing.B, batchSize int) {
	c := newCluster(b, kfake.BlackholeProduce())
	alo := openSink(b, testConfig(b, c, false))
	eos := openSink(b, testConfig(b, c, true))
	// Nothing can be read back from a blackholed cluster: start both
	// sinks as if they had read "no checkpoint".
	alo.stored["src"] = sourceState{}
	eos.stored["src"] = sourceState{}

	tbl := ordersTable("shop")
	at := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	changes := make([]tidemark.Change, batchSize)
	for i := range changes {
		id, tenant := int64(i%1000), fmt.Sprintf("tenant-%d", i%7)
		before := []any{id, tenant, tidemark.Decimal("100.00"), "a note that makes the row a bit bigger", at}
		after := []any{id, tenant, tidemark.Decimal(fmt.Sprintf("%d.%02d", i, i%100)), nil, at.Add(time.Duration(i) * time.Microsecond)}
		changes[i] = tidemark.Change{Op: tidemark.OpUpdate, Table: tbl, Before: before, After: after,
			Version: tidemark.Version{Seq: uint64(i/3 + 1), Index: uint32(i%3 + 1)}, CommitTime: at, Size: 300}
	}
	batch := func(i int) *tidemark.Batch {
		return &tidemark.Batch{Source: "src", Changes: changes, Checkpoint: gtid(uint64(i + 1))}
	}
	ctx := context.Background()
	timed := func(s *Sink, i int) time.Duration {
		start := time.Now()
		if _, err := s.Apply(ctx, batch(i)); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	timed(alo, 0) // create topics, warm up
	timed(eos, 0)

	var tALO, tEOS time.Duration
	b.ResetTimer()
	for i := 1; i <= b.N; i++ {
		if i%2 == 0 {
			tALO += timed(alo, i)
			tEOS += timed(eos, i)
		} else {
			tEOS += timed(eos, i)
			tALO += timed(alo, i)
		}
	}
	b.StopTimer()
	n := float64(b.N * batchSize)
	b.ReportMetric(n/tALO.Seconds(), "alo_changes/s")
	b.ReportMetric(n/tEOS.Seconds(), "eos_changes/s")
	b.ReportMetric(tALO.Seconds()/tEOS.Seconds(), "eos/alo")
}

// BenchmarkEncode measures building a batch's records (no I/O).
func BenchmarkEncode(b *testing.B) {
	c := newCluster(b)
	s := openSink(b, testConfig(b, c, false))
	st := newStream("src", "shop", 2000)
	batch := &tidemark.Batch{Source: "src", Changes: st.changes(), Checkpoint: gtid(2000)}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		s.mu.Lock()
		if _, _, err := s.encode(ctx, batch); err != nil {
			b.Fatal(err)
		}
		s.mu.Unlock()
	}
	b.ReportMetric(float64(len(batch.Changes)*b.N)/b.Elapsed().Seconds(), "changes/s")
}

// BenchmarkDecodeVsEncode decodes change envelopes as an applier does
// (decodeChange) and encodes the same changes (appendEnvelope), in one run,
// and reports both rates and decode/encode: what an applier pays per change
// on top of the tailer, before any PostgreSQL work.
//
//	go test -run '^$' -bench DecodeVsEncode -benchmem ./sink/kafka/
func BenchmarkDecodeVsEncode(b *testing.B) {
	tbl := ordersTable("shop")
	c, err := newCodec(tbl, "src", "topic", 1001)
	if err != nil {
		b.Fatal(err)
	}
	at := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	const n = 1000
	changes := make([]tidemark.Change, n)
	values := make([][]byte, n)
	for i := range changes {
		id, tenant := int64(i), fmt.Sprintf("tenant-%d", i%7)
		before := []any{id, tenant, tidemark.Decimal("100.00"), "a note that makes the row a bit bigger", at}
		after := []any{id, tenant, tidemark.Decimal(fmt.Sprintf("%d.%02d", i, i%100)), nil, at.Add(time.Duration(i) * time.Microsecond)}
		changes[i] = tidemark.Change{Op: tidemark.OpUpdate, Table: tbl, Before: before, After: after,
			Version: tidemark.Version{Seq: uint64(i/3 + 1), Index: uint32(i%3 + 1)}, CommitTime: at, Size: 300}
		if values[i], err = c.appendEnvelope(nil, &changes[i], gtid(7), at); err != nil {
			b.Fatal(err)
		}
	}
	var encode, decode time.Duration
	buf := make([]byte, 0, 512*n)
	for i := 0; i < b.N; i++ {
		start := time.Now()
		buf = buf[:0]
		for j := range changes {
			if buf, err = c.appendEnvelope(buf, &changes[j], gtid(7), at); err != nil {
				b.Fatal(err)
			}
		}
		encode += time.Since(start)
		start = time.Now()
		for _, v := range values {
			if _, err := decodeChange(v, tbl); err != nil {
				b.Fatal(err)
			}
		}
		decode += time.Since(start)
	}
	enc := float64(b.N*n) / encode.Seconds()
	dec := float64(b.N*n) / decode.Seconds()
	b.ReportMetric(enc, "encoded/s")
	b.ReportMetric(dec, "decoded/s")
	b.ReportMetric(dec/enc, "decode/encode")
}

package dedupe

import (
	"testing"
	"time"

	"tidemark"
)

// benchStream returns n updates over keys keys, with one replayed change in
// every ten, commit times one millisecond apart.
func benchStream(n, keys int) []tidemark.Change {
	out := make([]tidemark.Change, n)
	for i := range out {
		j := i
		if i%10 == 9 {
			j = i - 5 // a replay
		}
		out[i] = upd(int64(j%keys), "A", "B", ver(uint64(j+1), 1), t0.Add(time.Duration(j)*time.Millisecond))
	}
	return out
}

func BenchmarkFilter(b *testing.B) { benchFilter(b, benchStream(100_000, 10_000)) }

// benchFilter filters stream 1000 changes at a time, round and round.
func benchFilter(b *testing.B, stream []tidemark.Change) {
	w, err := New(Config{Delay: time.Minute, Now: func() time.Time { return t0.Add(time.Hour) }})
	if err != nil {
		b.Fatal(err)
	}
	batch := make([]tidemark.Change, 0, 1000)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		off := (i * 1000) % len(stream)
		batch = append(batch[:0], stream[off:off+1000]...)
		w.Filter(batch)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*1000), "ns/change")
}

// BenchmarkFilterDistinctKeys is a backlog of inserts of distinct keys, as
// in `make bench`: past Config.MaxKeys every change evicts the oldest key.
func BenchmarkFilterDistinctKeys(b *testing.B) {
	stream := make([]tidemark.Change, 400_000)
	for i := range stream {
		stream[i] = ins(int64(i), "A", ver(uint64(i+1), 1), t0.Add(time.Duration(i)*time.Microsecond))
	}
	benchFilter(b, stream)
}

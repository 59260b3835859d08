package main

import (
	"log/slog"

	"tidemark/binlog"
)

// This file is where the source is opened: the only place that builds a
// binlog.Config into its parts (binlog.New, NewReader, NewReaderFor,
// NewVerifier), with their logger, beside openStateTarget (targets.go).

// sourceParts are the parts of the source a command uses.
type sourceParts int

const (
	// useTailer: the replication stream (also the doctor's source checks
	// and the server's identity).
	useTailer sourceParts = 1 << iota
	// useReader: bounded reads and snapshots. With useTailer the reader
	// stamps what it captures with the epoch and identity the tailer
	// resolves (a catch-up after a reset binlog or a failover).
	useReader
	// useVerifier: the source side of verify and status (checksums,
	// binlog retention).
	useVerifier
)

// source is the opened parts of the config's source; the ones not asked
// for are nil.
type source struct {
	// cfg is the source's binlog config (name, zones).
	cfg      binlog.Config
	tailer   *binlog.Tailer
	reader   *binlog.Reader
	verifier *binlog.Verifier
}

// openChunkReader opens a second reader of tailer's source, stamped like
// the tailer's reader: the snapshots that run beside the stream read their
// chunks on it (a connection of its own). Its close is pushed on cl.
func openChunkReader(tailer *binlog.Tailer, cl *closers) (*binlog.Reader, error) {
	r, err := binlog.NewReaderFor(tailer)
	if err != nil {
		return nil, err
	}
	cl.push(r.Close)
	return r, nil
}

// openSource opens the parts use names of the config's source, each pushed
// on cl as it is opened (none connects yet). Their logger is log with
// component=binlog and the source's name.
func openSource(cfg *Config, log *slog.Logger, use sourceParts, cl *closers) (src *source, err error) {
	bc, err := cfg.BinlogConfig()
	if err != nil {
		return nil, err
	}
	bc.Logger = log.With("component", "binlog", "source", bc.Name)
	src = &source{cfg: bc}
	if use&useTailer != 0 {
		if src.tailer, err = binlog.New(bc); err != nil {
			return nil, err
		}
		cl.push(src.tailer.Close)
	}
	if use&useReader != 0 {
		if src.tailer != nil {
			src.reader, err = binlog.NewReaderFor(src.tailer)
		} else {
			src.reader, err = binlog.NewReader(bc)
		}
		if err != nil {
			return nil, err
		}
		cl.push(src.reader.Close)
	}
	if use&useVerifier != 0 {
		if src.verifier, err = binlog.NewVerifier(bc); err != nil {
			return nil, err
		}
		cl.push(src.verifier.Close)
	}
	return src, nil
}

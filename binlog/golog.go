package binlog

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
)

// goMySQLLogger routes go-mysql's log lines into l, with one correction: an
// ERROR line must mean an error. Closing a BinlogSyncer KILLs its dump
// connection; when the server has already ended it (every purged-position
// start: the server closes the dump thread after error 1236), the KILL
// fails with 1094 "Unknown thread id" and go-mysql logs that at ERROR
// although nothing is wrong. Those lines are logged at DEBUG.
func goMySQLLogger(l *slog.Logger) *slog.Logger {
	return slog.New(&goMySQLHandler{l.With("component", "go-mysql").Handler()})
}

type goMySQLHandler struct{ slog.Handler }

func (h *goMySQLHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelError && strings.HasPrefix(r.Message, "kill connection") {
		harmless := false
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "error" {
				s := fmt.Sprint(a.Value.Any())
				harmless = strings.Contains(s, "1094") || strings.Contains(s, "Unknown thread id")
			}
			return !harmless
		})
		if harmless {
			if !h.Enabled(ctx, slog.LevelDebug) {
				return nil
			}
			r2 := slog.NewRecord(r.Time, slog.LevelDebug, r.Message+" (the server had already ended it)", r.PC)
			r.Attrs(func(a slog.Attr) bool { r2.AddAttrs(a); return true })
			r = r2
		}
	}
	return h.Handler.Handle(ctx, r)
}

func (h *goMySQLHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &goMySQLHandler{h.Handler.WithAttrs(as)}
}

func (h *goMySQLHandler) WithGroup(name string) slog.Handler {
	return &goMySQLHandler{h.Handler.WithGroup(name)}
}

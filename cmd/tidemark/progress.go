package main

import (
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
)

// progressLogInterval is how often a Progress writes a log line when its
// output is not a terminal.
const progressLogInterval = 10 * time.Second

// Progress reports the progress of a long step (snapshot, catch-up,
// verify): a progress bar when w is a terminal, otherwise a log line every
// 10 seconds and one at Finish. It is safe for concurrent use.
type Progress struct {
	desc  string
	total int64
	log   *slog.Logger
	bar   *progressbar.ProgressBar

	mu      sync.Mutex
	done    int64
	start   time.Time
	lastLog time.Time
	now     func() time.Time
}

// isTerminal reports whether w is a character device (a TTY).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// NewProgress starts reporting a step of total units (rows); total -1 means
// unknown. log receives the periodic lines when w is not a terminal.
func NewProgress(w io.Writer, desc string, total int64, log *slog.Logger) *Progress {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &Progress{desc: desc, total: total, log: log, now: time.Now}
	p.start = p.now()
	p.lastLog = p.start
	if w != nil && isTerminal(w) {
		p.bar = progressbar.NewOptions64(total,
			progressbar.OptionSetWriter(w),
			progressbar.OptionSetDescription(desc),
			progressbar.OptionShowCount(),
			progressbar.OptionShowIts(),
			progressbar.OptionSetItsString("rows"),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish(),
			progressbar.OptionSetWidth(30),
		)
	}
	return p
}

// Add records n more units done.
func (p *Progress) Add(n int64) {
	if p.bar != nil {
		_ = p.bar.Add64(n)
	}
	p.mu.Lock()
	p.done += n
	now := p.now()
	logIt := p.bar == nil && now.Sub(p.lastLog) >= progressLogInterval
	if logIt {
		p.lastLog = now
	}
	done, el := p.done, now.Sub(p.start)
	p.mu.Unlock()
	if logIt {
		p.line("progress", done, el)
	}
}

// Finish ends the report: it clears the bar, or logs the final line.
func (p *Progress) Finish() {
	if p.bar != nil {
		_ = p.bar.Finish()
		return
	}
	p.mu.Lock()
	done, el := p.done, p.now().Sub(p.start)
	p.mu.Unlock()
	p.line("done", done, el)
}

func (p *Progress) line(msg string, done int64, el time.Duration) {
	args := []any{"step", p.desc, "rows", done, "elapsed", el.Round(time.Millisecond)}
	if s := el.Seconds(); s > 0 {
		args = append(args, "rows_per_s", int64(float64(done)/s))
	}
	if p.total > 0 {
		args = append(args, "total", p.total, "percent", int(100*done/p.total))
	}
	p.log.Info(msg, args...)
}

// Done returns the units recorded so far.
func (p *Progress) Done() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

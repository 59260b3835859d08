package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// vmHWM returns the peak resident set (VmHWM, KiB) of a process from
// /proc/<pid>/status ("self" for this process). Unlike getrusage's maxrss of
// children, it is the process's own high-water mark: a child forked from a
// large parent does not inherit the parent's.
func vmHWM(pid string) (int64, error) {
	f, err := os.Open("/proc/" + pid + "/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			fs := strings.Fields(v)
			if len(fs) == 0 {
				break
			}
			return strconv.ParseInt(fs[0], 10, 64)
		}
	}
	return 0, fmt.Errorf("read VmHWM of %s: not in /proc/%s/status", pid, pid)
}

// rssWatch polls a child's VmHWM until the process is gone; the last value
// read is its peak (VmHWM only grows). It is read every 50 ms so that the
// value from just before exit is kept.
type rssWatch struct {
	mu   sync.Mutex
	peak int64
	stop chan struct{}
	done chan struct{}
}

func watchRSS(pid int) *rssWatch {
	w := &rssWatch{stop: make(chan struct{}), done: make(chan struct{})}
	p := strconv.Itoa(pid)
	go func() {
		defer close(w.done)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			if v, err := vmHWM(p); err == nil {
				w.mu.Lock()
				w.peak = max(w.peak, v)
				w.mu.Unlock()
			}
			select {
			case <-w.stop:
				return
			case <-t.C:
			}
		}
	}()
	return w
}

// Peak stops the watch and returns the peak VmHWM seen, in KiB.
func (w *rssWatch) Peak() int64 {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.peak
}

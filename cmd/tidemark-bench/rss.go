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
	return statusKiB(pid, "VmHWM")
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
	p := strconv.Itoa(pid)
	return watchWith(func() (int64, error) { return vmHWM(p) })
}

// watchWith polls sample every 50 ms until Peak is called and keeps the
// largest value.
func watchWith(sample func() (int64, error)) *rssWatch {
	w := &rssWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			if v, err := sample(); err == nil {
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

// statusKiB reads one "Name:   N kB" field of /proc/<pid>/status.
func statusKiB(pid, field string) (int64, error) {
	f, err := os.Open("/proc/" + pid + "/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			fs := strings.Fields(v)
			if len(fs) == 0 {
				break
			}
			return strconv.ParseInt(fs[0], 10, 64)
		}
	}
	return 0, fmt.Errorf("read %s of %s: not in /proc/%s/status", field, pid, pid)
}

// treeRSS is the resident set (VmRSS, KiB) of a process and all its
// descendants, summed (/proc/<pid>/stat gives each process's parent).
func treeRSS(root int) int64 {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	children := map[int][]int{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid …; comm may hold spaces and parentheses.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		fs := strings.Fields(string(b[i+1:]))
		if len(fs) < 2 {
			continue
		}
		if ppid, err := strconv.Atoi(fs[1]); err == nil {
			children[ppid] = append(children[ppid], pid)
		}
	}
	var sum int64
	for todo := []int{root}; len(todo) > 0; {
		pid := todo[len(todo)-1]
		todo = append(todo[:len(todo)-1], children[pid]...)
		if v, err := statusKiB(strconv.Itoa(pid), "VmRSS"); err == nil {
			sum += v
		}
	}
	return sum
}

// watchTree polls the summed resident set of a process and its
// descendants (treeRSS) every 50 ms until it is gone; Peak is the largest
// sum seen. For a tool that runs as several processes (pg_chameleon: runuser,
// then python), where the VmHWM of the process started says nothing.
func watchTree(pid int) *rssWatch {
	return watchWith(func() (int64, error) { return treeRSS(pid), nil })
}

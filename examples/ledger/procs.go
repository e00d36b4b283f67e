package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"sync"
)

// fleet owns the worker processes of one mode: it starts them, talks to
// them, and in stop kills whatever still runs and waits for all of them, so
// that no worker outlives the mode, however the mode ends.
type fleet struct {
	procs  []*proc
	events chan procEvent
	done   chan struct{} // closed by stop: nobody reads events any more
	wg     sync.WaitGroup
	once   sync.Once
}

// proc is one worker process. Its fields are the orchestrator's; the
// reader goroutine only reads stdout and waits for the process.
type proc struct {
	n      int // 1-based worker number
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	enc    *json.Encoder
	queue  []command // commands not sent yet
	busy   bool      // a command is in flight
	frozen bool
	exited bool
}

// procEvent is a report from a worker, or its exit.
type procEvent struct {
	n      int
	rep    report
	exited bool
	err    error // with exited: how it ended
}

// startFleet starts n workers: exe with args(i) for worker i (1-based),
// environment env, stderr lines prefixed with the worker's number.
func startFleet(exe string, n int, args func(i int) []string, env []string, stderr io.Writer) (*fleet, error) {
	f := &fleet{events: make(chan procEvent), done: make(chan struct{})}
	var mu sync.Mutex // one writer of stderr at a time
	for i := 1; i <= n; i++ {
		cmd := exec.Command(exe, args(i)...)
		cmd.Env = env
		cmd.SysProcAttr = sysProcAttr()
		cmd.Stderr = &prefixWriter{mu: &mu, w: stderr, prefix: fmt.Sprintf("worker %d: ", i)}
		stdin, err := cmd.StdinPipe()
		if err != nil {
			f.stop()
			return nil, err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			f.stop()
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			f.stop()
			return nil, fmt.Errorf("start worker %d (%s): %w", i, exe, err)
		}
		p := &proc{n: i, cmd: cmd, stdin: stdin, enc: json.NewEncoder(stdin)}
		f.procs = append(f.procs, p)
		f.wg.Add(1)
		go f.read(p, stdout)
	}
	return f, nil
}

// read is a worker's reader goroutine: it turns the worker's stdout into
// events, then waits for the worker (after stdout has been read to the end,
// as exec.Cmd requires) and sends its exit.
func (f *fleet) read(p *proc, stdout io.Reader) {
	defer f.wg.Done()
	sc := bufio.NewScanner(stdout)
	var perr error
	for sc.Scan() {
		var rep report
		if err := json.Unmarshal(sc.Bytes(), &rep); err != nil {
			perr = fmt.Errorf("worker %d wrote %q, not a report: %w", p.n, sc.Text(), err)
			break
		}
		if !f.send(procEvent{n: p.n, rep: rep}) {
			break
		}
	}
	_, _ = io.Copy(io.Discard, stdout) // to EOF, so that Wait may close it
	err := p.cmd.Wait()
	f.send(procEvent{n: p.n, exited: true, err: errors.Join(perr, err)})
}

func (f *fleet) send(e procEvent) bool {
	select {
	case f.events <- e:
		return true
	case <-f.done:
		return false
	}
}

// next sends the next queued command to p if it is idle.
func (f *fleet) next(p *proc) error {
	if p.busy || len(p.queue) == 0 || p.exited {
		return nil
	}
	c := p.queue[0]
	p.queue = p.queue[1:]
	p.busy = true
	return f.write(p, c)
}

func (f *fleet) write(p *proc, c command) error {
	if err := p.enc.Encode(c); err != nil {
		return fmt.Errorf("write to worker %d: %w", p.n, err)
	}
	return nil
}

// closeInputs closes every worker's stdin: a worker exits when its stdin
// closes.
func (f *fleet) closeInputs() {
	for _, p := range f.procs {
		_ = p.stdin.Close()
	}
}

// stop kills every worker still running, and waits for them and their
// reader goroutines. It is idempotent.
func (f *fleet) stop() {
	f.once.Do(func() {
		f.closeInputs()
		for _, p := range f.procs {
			if p.exited {
				continue
			}
			if p.frozen {
				_ = thaw(p.cmd.Process) // SIGKILL ends a stopped process too, but say what we mean
			}
			_ = p.cmd.Process.Kill() // os.ErrProcessDone if it has just exited
		}
		close(f.done)
		f.wg.Wait()
	})
}

// wait reads events until every worker has exited, after closeInputs, and
// returns the first that did not exit cleanly.
func (f *fleet) wait(ctx context.Context) error {
	var errs []error
	for {
		running := 0
		for _, p := range f.procs {
			if !p.exited {
				running++
			}
		}
		if running == 0 {
			return errors.Join(errs...)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e := <-f.events:
			if e.exited {
				f.procs[e.n-1].exited = true
				if e.err != nil {
					errs = append(errs, fmt.Errorf("worker %d: %w", e.n, e.err))
				}
				continue
			}
			errs = append(errs, fmt.Errorf("worker %d reported %q after its last command", e.n, e.rep.Type))
		}
	}
}

// prefixWriter writes whole lines, each with a prefix, to a shared writer.
type prefixWriter struct {
	mu     *sync.Mutex
	w      io.Writer
	prefix string
	buf    []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.buf = append(p.buf, b...)
	for {
		i := bytes.IndexByte(p.buf, '\n')
		if i < 0 {
			break
		}
		p.mu.Lock()
		_, _ = fmt.Fprintf(p.w, "%s%s\n", p.prefix, p.buf[:i]) // a lost log line must not stop the copy
		p.mu.Unlock()
		p.buf = p.buf[i+1:]
	}
	return len(b), nil
}

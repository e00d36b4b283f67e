package compare

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"time"
)

// journal is every event of a scenario, in the order the orchestrator
// received them. Waiters are woken on every new event.
type journal struct {
	mu      sync.Mutex
	events  []event
	changed chan struct{}
	errs    []error // workers that failed
}

func newJournal() *journal { return &journal{changed: make(chan struct{})} }

func (j *journal) add(e event) {
	j.mu.Lock()
	j.events = append(j.events, e)
	close(j.changed)
	j.changed = make(chan struct{})
	j.mu.Unlock()
}

func (j *journal) fail(err error) {
	j.mu.Lock()
	j.errs = append(j.errs, err)
	close(j.changed)
	j.changed = make(chan struct{})
	j.mu.Unlock()
}

func (j *journal) snapshot() []event {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]event(nil), j.events...)
}

// waitFor waits until cond holds over the events, the timeout passes
// (false), or a worker fails (an error).
func (j *journal) waitFor(ctx context.Context, timeout time.Duration, cond func([]event) bool) (bool, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		j.mu.Lock()
		ok := cond(j.events)
		err := errors.Join(j.errs...)
		ch := j.changed
		j.mu.Unlock()
		if err != nil {
			return false, err
		}
		if ok {
			return true, nil
		}
		select {
		case <-ch:
		case <-t.C:
			return false, nil
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
}

// workerProc is one worker process.
type workerProc struct {
	id    int
	cfg   workerConfig
	p     *proc
	stdin io.WriteCloser
	enc   *json.Encoder
	sent  int // transfers sent
	log   *logTail
	wg    sync.WaitGroup
}

func startWorker(exe string, cfg workerConfig, j *journal, verbose io.Writer) (*workerProc, error) {
	b, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), envWorker+"="+string(b))
	w := &workerProc{id: cfg.ID, cfg: cfg, log: &logTail{}}
	cmd.Stderr = w.log
	if verbose != nil {
		cmd.Stderr = io.MultiWriter(w.log, &prefixWriter{w: verbose, prefix: fmt.Sprintf("worker %d: ", cfg.ID)})
	}
	if w.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if w.p, err = startProc(cmd); err != nil {
		return nil, err
	}
	w.enc = json.NewEncoder(w.stdin)
	w.wg.Go(func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var e event
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				j.fail(fmt.Errorf("worker %d wrote %q: %w", cfg.ID, sc.Text(), err))
				continue
			}
			e.Worker = cfg.ID
			j.add(e)
		}
		<-w.p.done
		if code := cmd.ProcessState.ExitCode(); code != 0 && code != -1 {
			j.fail(fmt.Errorf("worker %d exited with %d: %s", cfg.ID, code, w.log.String()))
		}
	})
	return w, nil
}

func (w *workerProc) send(c command) error {
	if c.Op == opTransfer {
		w.sent++
	}
	if err := w.enc.Encode(c); err != nil {
		return fmt.Errorf("worker %d: %w (%s)", w.id, err, w.log.String())
	}
	return nil
}

// stop closes the worker's stdin, lets it finish and exit, and kills it
// after grace.
func (w *workerProc) stop(grace time.Duration) {
	_ = w.p.thaw()
	_ = w.stdin.Close()
	select {
	case <-w.p.done:
	case <-time.After(grace):
		w.p.kill()
	}
	w.wg.Wait()
}

// prefixWriter writes whole lines, each with a prefix.
type prefixWriter struct {
	mu     sync.Mutex
	w      io.Writer
	prefix string
	buf    []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.buf = append(p.buf, b...)
	for {
		i := bytes.IndexByte(p.buf, '\n')
		if i < 0 {
			return len(b), nil
		}
		fmt.Fprintf(p.w, "%s%s\n", p.prefix, p.buf[:i])
		p.buf = p.buf[i+1:]
	}
}

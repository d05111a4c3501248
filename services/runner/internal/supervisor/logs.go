package supervisor

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/conclave-ai/conclave/services/runner/internal/records"
)

// Log streams.
const (
	StreamStderr = "stderr"
	StreamACP    = "acp"
	StreamRunner = "runner"
)

// maxLogLine bounds one stored line; longer ones are cut.
const maxLogLine = 16 << 10

// logBook writes instance logs to the store in chunks and fans new lines
// out to followers.
type logBook struct {
	rec *records.Records
	log *slog.Logger

	mu        sync.Mutex
	followers map[string]map[chan records.LogLine]struct{}
}

func newLogBook(rec *records.Records, logger *slog.Logger) *logBook {
	return &logBook{rec: rec, log: logger, followers: map[string]map[chan records.LogLine]struct{}{}}
}

// Follow returns a channel of the instance's new lines. It is closed when
// the follower falls more than its buffer behind, or by stop.
func (b *logBook) Follow(instanceID string) (<-chan records.LogLine, func()) {
	ch := make(chan records.LogLine, 1024)
	b.mu.Lock()
	if b.followers[instanceID] == nil {
		b.followers[instanceID] = map[chan records.LogLine]struct{}{}
	}
	b.followers[instanceID][ch] = struct{}{}
	b.mu.Unlock()
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			b.mu.Lock()
			if _, ok := b.followers[instanceID][ch]; ok {
				delete(b.followers[instanceID], ch)
				close(ch)
			}
			b.mu.Unlock()
		})
	}
}

func (b *logBook) fanOut(instanceID string, l records.LogLine) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for ch := range b.followers[instanceID] {
		select {
		case ch <- l:
		default:
			// A follower this far behind is cut off rather than slowing the
			// agent down; it can reconnect and read the tail.
			delete(b.followers[instanceID], ch)
			close(ch)
		}
	}
}

// instanceLog is one instance's log writer: lines are batched into chunks
// of up to 256 lines or 64 KiB, or what 200ms brings.
type instanceLog struct {
	book       *logBook
	instanceID string
	lines      chan records.LogLine
	done       chan struct{}
	// closeMu orders Add's sends before Close's close of lines.
	closeMu sync.RWMutex
	closed  bool
	// seqMu guards seq: run's until done is closed, then late Adds'.
	seqMu sync.Mutex
	seq   int64
	// holdMu guards holding and held: lines kept back until Release (or
	// dropped by Discard), for a launch whose claim is not settled yet.
	holdMu     sync.Mutex
	holding    bool
	discarding bool
	held       []records.LogLine
}

// Hold keeps lines back from followers and the store until Release.
func (l *instanceLog) Hold() {
	l.holdMu.Lock()
	l.holding = true
	l.holdMu.Unlock()
}

// Release records the lines held, in order, and those after them as usual.
func (l *instanceLog) Release() {
	l.holdMu.Lock()
	defer l.holdMu.Unlock()
	for _, line := range l.held {
		l.record(line)
	}
	l.holding, l.held = false, nil
}

// Discard drops the lines held, and those added later: the launch was not
// this session's to log.
func (l *instanceLog) Discard() {
	l.holdMu.Lock()
	defer l.holdMu.Unlock()
	l.holding, l.held = true, nil
	l.discarding = true
}

func (b *logBook) open(ctx context.Context, instanceID string) *instanceLog {
	l := &instanceLog{book: b, instanceID: instanceID, lines: make(chan records.LogLine, 4096), done: make(chan struct{})}
	go func() {
		// A new launch of the same instance appends after what is stored;
		// the read is off the launch's path, lines wait for it in l.lines.
		_, newest, err := b.rec.TailLogs(context.WithoutCancel(ctx), instanceID, 1)
		if err != nil {
			b.log.WarnContext(ctx, "runner: reading the log's last chunk", "instance_id", instanceID, "error", err)
		}
		l.seqMu.Lock()
		l.seq = newest + 1
		l.seqMu.Unlock()
		l.run()
	}()
	return l
}

// Add records a line.
func (l *instanceLog) Add(stream, text string) {
	if len(text) > maxLogLine {
		text = strings.ToValidUTF8(text[:maxLogLine], "") + "…"
	}
	if !utf8.ValidString(text) {
		text = strings.ToValidUTF8(text, "\uFFFD")
	}
	line := records.LogLine{Time: time.Now().UTC(), Stream: stream, Text: text}
	l.holdMu.Lock()
	if l.holding {
		if !l.discarding {
			l.held = append(l.held, line)
		}
		l.holdMu.Unlock()
		return
	}
	l.holdMu.Unlock()
	l.record(line)
}

// record fans line out and stores it.
func (l *instanceLog) record(line records.LogLine) {
	l.book.fanOut(l.instanceID, line)
	l.closeMu.RLock()
	if !l.closed {
		l.lines <- line
		l.closeMu.RUnlock()
		return
	}
	l.closeMu.RUnlock()
	// After Close (a cancel's line as the launch ends): written on its own.
	<-l.done
	l.store([]records.LogLine{line})
}

// Close flushes what is buffered.
func (l *instanceLog) Close() {
	l.closeMu.Lock()
	if !l.closed {
		l.closed = true
		close(l.lines)
	}
	l.closeMu.Unlock()
	<-l.done
}

// store writes lines as the next chunk.
func (l *instanceLog) store(lines []records.LogLine) {
	l.seqMu.Lock()
	defer l.seqMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := l.book.rec.AppendLogs(ctx, l.instanceID, l.seq, lines); err != nil {
		l.book.log.Warn("runner: storing log lines", "instance_id", l.instanceID, "lines", len(lines), "error", err)
	}
	l.seq++
}

func (l *instanceLog) run() {
	defer close(l.done)
	var (
		batch []records.LogLine
		bytes int
		tick  = time.NewTicker(200 * time.Millisecond)
	)
	defer tick.Stop()
	flush := func() {
		if len(batch) == 0 {
			return
		}
		l.store(batch)
		batch, bytes = batch[:0:0], 0
	}
	for {
		select {
		case line, ok := <-l.lines:
			if !ok {
				flush()
				return
			}
			batch = append(batch, line)
			bytes += len(line.Text) + 64
			if len(batch) >= 256 || bytes >= 64<<10 {
				flush()
			}
		case <-tick.C:
			flush()
		}
	}
}

// lineWriter turns a byte stream (an agent's stderr) into log lines.
type lineWriter struct {
	log    *instanceLog
	stream string
	buf    []byte
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.log.Add(w.stream, string(bytes.TrimRight(w.buf[:i], "\r")))
		w.buf = w.buf[i+1:]
	}
	if len(w.buf) > maxLogLine {
		w.log.Add(w.stream, string(w.buf))
		w.buf = w.buf[:0]
	}
	return len(p), nil
}

// Flush writes a last unterminated line.
func (w *lineWriter) Flush() {
	if len(w.buf) > 0 {
		w.log.Add(w.stream, string(w.buf))
		w.buf = nil
	}
}

package supervisor

import (
	"bytes"
	"context"
	"log/slog"
	"slices"
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

	// mu guards followers, writing and every instanceLog's unstored lines.
	mu        sync.Mutex
	followers map[string]map[chan records.LogLine]struct{}
	writing   map[string]map[*instanceLog]struct{}
}

func newLogBook(rec *records.Records, logger *slog.Logger) *logBook {
	return &logBook{rec: rec, log: logger,
		followers: map[string]map[chan records.LogLine]struct{}{},
		writing:   map[string]map[*instanceLog]struct{}{},
	}
}

// Follow returns a channel of the instance's new lines, and the lines
// already sent to followers but not yet stored, oldest first: a follower
// that reads the store after subscribing misses none of them. The channel
// is closed when the follower falls more than its buffer behind, or by
// stop.
func (b *logBook) Follow(instanceID string) (live <-chan records.LogLine, unstored []records.LogLine, stop func()) {
	ch := make(chan records.LogLine, 1024)
	b.mu.Lock()
	if b.followers[instanceID] == nil {
		b.followers[instanceID] = map[chan records.LogLine]struct{}{}
	}
	b.followers[instanceID][ch] = struct{}{}
	for l := range b.writing[instanceID] {
		unstored = append(unstored, l.unstored...)
	}
	b.mu.Unlock()
	// Two logs of one instance overlap only while a launch ends and the
	// next begins; their lines interleave by time.
	slices.SortStableFunc(unstored, func(a, b records.LogLine) int { return a.Time.Compare(b.Time) })
	var once sync.Once
	return ch, unstored, func() {
		once.Do(func() {
			b.mu.Lock()
			if _, ok := b.followers[instanceID][ch]; ok {
				delete(b.followers[instanceID], ch)
				close(ch)
			}
			if len(b.followers[instanceID]) == 0 {
				delete(b.followers, instanceID)
			}
			b.mu.Unlock()
		})
	}
}

// fanOut sends line to the instance's followers and keeps it among l's
// unstored lines until l.stored.
func (b *logBook) fanOut(l *instanceLog, line records.LogLine) {
	b.mu.Lock()
	defer b.mu.Unlock()
	l.unstored = append(l.unstored, line)
	for ch := range b.followers[l.instanceID] {
		select {
		case ch <- line:
		default:
			// A follower this far behind is cut off rather than slowing the
			// agent down; it can reconnect and read the tail.
			delete(b.followers[l.instanceID], ch)
			close(ch)
		}
	}
}

// stored drops l's n oldest unstored lines: they were written (or given
// up on).
func (b *logBook) stored(l *instanceLog, n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n = min(n, len(l.unstored))
	l.unstored = append(l.unstored[:0:0], l.unstored[n:]...)
}

func (b *logBook) register(l *instanceLog) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.writing[l.instanceID] == nil {
		b.writing[l.instanceID] = map[*instanceLog]struct{}{}
	}
	b.writing[l.instanceID][l] = struct{}{}
}

func (b *logBook) unregister(l *instanceLog) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.writing[l.instanceID], l)
	if len(b.writing[l.instanceID]) == 0 {
		delete(b.writing, l.instanceID)
	}
}

// instanceLog is one instance's log writer: lines are batched into chunks
// of up to 256 lines or 64 KiB, or what 200ms brings.
type instanceLog struct {
	book       *logBook
	instanceID string
	lines      chan records.LogLine
	// syncs asks run to store what it has; run closes the channel sent
	// once it has.
	syncs chan chan struct{}
	done  chan struct{}
	// closeMu orders Add's sends before Close's close of lines.
	closeMu sync.RWMutex
	closed  bool
	// seqMu guards seq: run's until done is closed, then late Adds'.
	seqMu sync.Mutex
	seq   int64
	// mu orders lines: each gets a time later than the one before, and
	// reaches followers and the store in that order, so a follower can
	// tell by time alone which lines it has sent. It also guards holding
	// and held: lines kept back until Release (or dropped by Discard), for
	// a launch whose claim is not settled yet.
	mu         sync.Mutex
	last       time.Time
	holding    bool
	discarding bool
	held       []records.LogLine
	// unstored (guarded by book.mu) are the lines sent to followers and
	// not yet stored.
	unstored []records.LogLine
}

// Hold keeps lines back from followers and the store until Release.
func (l *instanceLog) Hold() {
	l.mu.Lock()
	l.holding = true
	l.mu.Unlock()
}

// Release records the lines held, in order, and those after them as usual.
func (l *instanceLog) Release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.held {
		l.record(line)
	}
	l.holding, l.held = false, nil
}

// Discard drops the lines held, and those added later: the launch was not
// this session's to log.
func (l *instanceLog) Discard() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.holding, l.held = true, nil
	l.discarding = true
}

func (b *logBook) open(ctx context.Context, instanceID string) *instanceLog {
	l := &instanceLog{book: b, instanceID: instanceID, lines: make(chan records.LogLine, 4096), syncs: make(chan chan struct{}), done: make(chan struct{})}
	b.register(l)
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
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now().UTC()
	if !now.After(l.last) {
		now = l.last.Add(time.Nanosecond)
	}
	l.last = now
	line := records.LogLine{Time: now, Stream: stream, Text: text}
	if l.holding {
		if !l.discarding {
			l.held = append(l.held, line)
		}
		return
	}
	l.record(line)
}

// record fans line out and stores it; l.mu is held.
func (l *instanceLog) record(line records.LogLine) {
	l.book.fanOut(l, line)
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

// Sync returns once every line recorded before it is stored, or with ctx:
// a status written after it never runs ahead of the log.
func (l *instanceLog) Sync(ctx context.Context) {
	stored := make(chan struct{})
	select {
	case l.syncs <- stored:
	case <-l.done:
		return
	case <-ctx.Done():
		return
	}
	select {
	case <-stored:
	case <-ctx.Done():
	}
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
	l.book.unregister(l)
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
	l.book.stored(l, len(lines))
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
	add := func(line records.LogLine) {
		batch = append(batch, line)
		bytes += len(line.Text) + 64
		if len(batch) >= 256 || bytes >= 64<<10 {
			flush()
		}
	}
	for {
		select {
		case line, ok := <-l.lines:
			if !ok {
				flush()
				return
			}
			add(line)
		case stored := <-l.syncs:
			// Every line recorded before Sync is in l.lines by now.
			for drained := false; !drained; {
				select {
				case line, ok := <-l.lines:
					if !ok {
						flush()
						close(stored)
						return
					}
					add(line)
				default:
					drained = true
				}
			}
			flush()
			close(stored)
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

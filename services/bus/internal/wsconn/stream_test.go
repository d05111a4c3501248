package wsconn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// serve starts a WebSocket server on loopback whose connections are
// Streams with opts, handed to the test on the returned channel. Each is
// read until it ends, as the bus's JSON-RPC connections are: the read
// side answers pings and completes the close handshake.
func serve(t *testing.T, opts Options) (string, <-chan *Stream) {
	t.Helper()
	return serveStreams(t, opts, true)
}

// serveUnread is serve for a test that reads the streams itself.
func serveUnread(t *testing.T, opts Options) (string, <-chan *Stream) {
	t.Helper()
	return serveStreams(t, opts, false)
}

func serveStreams(t *testing.T, opts Options, read bool) (string, <-chan *Stream) {
	t.Helper()
	streams := make(chan *Stream, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s, err := Accept(w, r, opts)
		if err != nil {
			t.Errorf("accept: %v", err)
			return
		}
		streams <- s
		if !read {
			return
		}
		go func() {
			for {
				if _, err := s.ReadMessage(context.Background()); err != nil {
					return
				}
			}
		}()
	}))
	t.Cleanup(srv.Close)
	return "ws" + strings.TrimPrefix(srv.URL, "http"), streams
}

func dial(t *testing.T, url string) *websocket.Conn {
	t.Helper()
	c, _, err := websocket.Dial(context.Background(), url, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadLimit(1 << 20)
	t.Cleanup(func() { _ = c.CloseNow() })
	return c
}

// TestConcurrentWritersKeepFramesWholeAndInOrder: frames written or
// queued at once by many goroutines (so that most are queued and batched)
// each arrive whole, and each goroutine's in the order it sent them.
func TestConcurrentWritersKeepFramesWholeAndInOrder(t *testing.T) {
	t.Parallel()
	const writers, frames = 8, 200
	url, streams := serve(t, Options{MaxFrame: 1 << 20, Buffered: writers * frames, WriteTimeout: time.Minute})
	client := dial(t, url)
	s := <-streams
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range frames {
				// Sizes vary around the read buffer's, so that frames
				// straddle it, and around copyLimit, so that batches mix
				// copied payloads and payloads written in place.
				frame := fmt.Sprintf(`{"writer":%d,"seq":%d,"pad":%q}`, w, i, strings.Repeat("x", (i*37)%5000))
				// Half the writers queue their frames as a fan-out does,
				// flushing after every third.
				var err error
				if w%2 == 1 {
					err = s.QueueMessage(context.Background(), []byte(frame))
					if err == nil && i%3 == 2 || i == frames-1 {
						err = errors.Join(err, s.Flush())
					}
				} else {
					err = s.WriteMessage(context.Background(), []byte(frame))
				}
				if err != nil {
					t.Errorf("write: %v", err)
					return
				}
			}
		})
	}
	next := make([]int, writers)
	for range writers * frames {
		_, data, err := client.Read(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var w, seq int
		if _, err := fmt.Sscanf(string(data), `{"writer":%d,"seq":%d,`, &w, &seq); err != nil {
			t.Fatalf("frame %q: %v", data, err)
		}
		if want := fmt.Sprintf(`{"writer":%d,"seq":%d,"pad":%q}`, w, seq, strings.Repeat("x", (seq*37)%5000)); string(data) != want {
			t.Fatalf("frame %q, want %q", data, want)
		}
		if seq != next[w] {
			t.Fatalf("writer %d: frame %d arrived before %d", w, seq, next[w])
		}
		next[w]++
	}
	wg.Wait()
}

// countingConn counts the writes to the socket.
type countingConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// TestQueuedFramesGoOutTogether: queued frames are written by Flush, or
// by the next WriteMessage ahead of its own frame, in order and in one
// system call.
func TestQueuedFramesGoOutTogether(t *testing.T) {
	t.Parallel()
	url, streams := serve(t, Options{MaxFrame: 1 << 20, Buffered: 100, WriteTimeout: time.Minute})
	client := dial(t, url)
	s := <-streams
	counter := &countingConn{Conn: s.conn}
	s.conn = counter // no write has happened yet: the upgrade's answer went through net/http

	send := []struct {
		frames  []string
		queue   bool // queue every frame, then Flush; else queue all but the last, written with WriteMessage
		written string
	}{
		{frames: []string{`{"a":1}`, `{"a":2}`, `{"a":3}`}, queue: true},
		{frames: []string{`{"b":1}`, `{"b":2}`}},
		{frames: []string{`{"c":1}`}},
	}
	for _, step := range send {
		before := counter.writes.Load()
		for i, f := range step.frames {
			var err error
			if !step.queue && i == len(step.frames)-1 {
				err = s.WriteMessage(context.Background(), []byte(f))
			} else {
				err = s.QueueMessage(context.Background(), []byte(f))
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		if step.queue {
			if err := s.Flush(); err != nil {
				t.Fatal(err)
			}
		}
		if got := counter.writes.Load() - before; got != 1 {
			t.Errorf("%v: %d writes to the socket, want 1", step.frames, got)
		}
		for _, want := range step.frames {
			_, data, err := client.Read(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if string(data) != want {
				t.Fatalf("frame %s, want %s", data, want)
			}
		}
	}
	if err := s.Flush(); err != nil {
		t.Errorf("flushing an empty queue: %v", err)
	}
}

// TestCloseWritesQueuedFramesThenCloses: Close returns at once; frames
// already accepted still reach the peer, followed by the close status.
func TestCloseWritesQueuedFramesThenCloses(t *testing.T) {
	t.Parallel()
	closed := make(chan struct{})
	url, streams := serve(t, Options{MaxFrame: 1 << 20, Buffered: 100, WriteTimeout: time.Minute, OnClose: func() { close(closed) }})
	client := dial(t, url)
	s := <-streams
	for i := range 50 {
		if err := s.WriteMessage(context.Background(), fmt.Appendf(nil, `{"n":%d}`, i)); err != nil {
			t.Fatal(err)
		}
	}
	s.CloseWith(StatusGoingAway, "bye")
	<-closed
	if err := s.WriteMessage(context.Background(), []byte(`{}`)); err == nil {
		t.Error("a write after Close succeeded")
	}
	for i := range 50 {
		_, data, err := client.Read(context.Background())
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if want := fmt.Sprintf(`{"n":%d}`, i); string(data) != want {
			t.Fatalf("frame %q, want %q", data, want)
		}
	}
	_, _, err := client.Read(context.Background())
	if got := websocket.CloseStatus(err); got != websocket.StatusGoingAway {
		t.Errorf("close status %v (%v), want going away", got, err)
	}
}

// TestSlowReaderIsDisconnected: a peer that reads nothing fills the socket
// and then the queue; the writer is told, and the connection ends, with
// 1008 when the close frame could still be sent (a write cut off by its
// deadline can leave the peer half a frame instead).
func TestSlowReaderIsDisconnected(t *testing.T) {
	t.Parallel()
	url, streams := serve(t, Options{MaxFrame: 1 << 20, Buffered: 4, WriteTimeout: 200 * time.Millisecond})
	client := dial(t, url)
	s := <-streams
	frame := []byte(`{"pad":"` + strings.Repeat("x", 64<<10) + `"}`)
	var err error
	for i := 0; i < 10000 && err == nil; i++ {
		err = s.WriteMessage(context.Background(), frame)
	}
	if !errors.Is(err, ErrSlowReader) && !errors.Is(err, errClosed) {
		t.Fatalf("writing to a peer that does not read: %v, want ErrSlowReader", err)
	}
	for {
		_, _, err := client.Read(context.Background())
		if err == nil {
			continue // what the socket held before the bus gave up
		}
		if got := websocket.CloseStatus(err); got != -1 && got != websocket.StatusCode(StatusSlowReader) {
			t.Errorf("close status %v (%v), want %v", got, err, StatusSlowReader)
		}
		return
	}
}

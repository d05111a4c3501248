package wsconn

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// serve starts a WebSocket server on loopback whose connections are
// Streams with opts, handed to the test on the returned channel.
func serve(t *testing.T, opts Options) (string, <-chan *Stream) {
	t.Helper()
	streams := make(chan *Stream, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s, err := Accept(w, r, opts)
		if err != nil {
			t.Errorf("accept: %v", err)
			return
		}
		streams <- s
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

// TestConcurrentWritersKeepFramesWholeAndInOrder: frames written at once
// by many goroutines (so that most are queued and batched) each arrive
// whole, and each goroutine's in the order it wrote them.
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
				// straddle it.
				frame := fmt.Sprintf(`{"writer":%d,"seq":%d,"pad":%q}`, w, i, strings.Repeat("x", (i*37)%700))
				if err := s.WriteMessage(context.Background(), []byte(frame)); err != nil {
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
		if want := fmt.Sprintf(`{"writer":%d,"seq":%d,"pad":%q}`, w, seq, strings.Repeat("x", (seq*37)%700)); string(data) != want {
			t.Fatalf("frame %q, want %q", data, want)
		}
		if seq != next[w] {
			t.Fatalf("writer %d: frame %d arrived before %d", w, seq, next[w])
		}
		next[w]++
	}
	wg.Wait()
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
	s.CloseWith(websocket.StatusGoingAway, "bye")
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
		if got := websocket.CloseStatus(err); got != -1 && got != StatusSlowReader {
			t.Errorf("close status %v (%v), want %v", got, err, StatusSlowReader)
		}
		return
	}
}

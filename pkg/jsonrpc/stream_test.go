package jsonrpc

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
)

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

func TestLineStreamRead(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 100<<10) // longer than the read buffer
	tests := []struct {
		name    string
		input   string
		max     int
		want    []string
		wantErr error
	}{
		{name: "lines", input: "a\nb\n", want: []string{"a", "b"}, wantErr: io.EOF},
		{name: "CRLF and blank lines", input: "a\r\n\r\n\n  \nb\r\n", want: []string{"a", "b"}, wantErr: io.EOF},
		{name: "last line without newline", input: "a\nb", want: []string{"a", "b"}, wantErr: io.EOF},
		{name: "line longer than the buffer", input: long + "\nz\n", want: []string{long, "z"}, wantErr: io.EOF},
		{name: "line at the limit", input: "12345\n", max: 5, want: []string{"12345"}, wantErr: io.EOF},
		{name: "line over the limit", input: "ok\n123456\n", max: 5, want: []string{"ok"}, wantErr: ErrFrameTooLarge},
		{name: "long line over the limit", input: long + "\n", max: 70 << 10, wantErr: ErrFrameTooLarge},
		{name: "unterminated line over the limit", input: "123456", max: 5, wantErr: ErrFrameTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := NewLineStream(strings.NewReader(tt.input), nopWriteCloser{io.Discard}, tt.max)
			var got []string
			var err error
			for {
				var frame []byte
				if frame, err = s.ReadMessage(t.Context()); err != nil {
					break
				}
				got = append(got, string(frame))
			}
			if !errors.Is(err, tt.wantErr) {
				t.Errorf("error = %v, want %v", err, tt.wantErr)
			}
			if strings.Join(got, "|") != strings.Join(tt.want, "|") {
				t.Errorf("frames = %.60q, want %.60q", got, tt.want)
			}
		})
	}
}

func TestLineStreamFramesAreNotShared(t *testing.T) {
	t.Parallel()
	s := NewLineStream(strings.NewReader("aaa\nbbb\n"), nopWriteCloser{io.Discard}, 0)
	first, _ := s.ReadMessage(t.Context())
	if _, err := s.ReadMessage(t.Context()); err != nil {
		t.Fatal(err)
	}
	// Decoded messages alias the frame while their handlers run.
	if string(first) != "aaa" {
		t.Errorf("first frame changed to %q after the next read", first)
	}
}

func TestLineStreamConcurrentWrites(t *testing.T) {
	t.Parallel()
	r, w := io.Pipe()
	s := NewLineStream(strings.NewReader(""), w, 0)
	const writers, each = 8, 50
	var wg sync.WaitGroup
	for i := range writers {
		wg.Go(func() {
			for j := range each {
				// Frames big enough that a pipe would split them if writes
				// were not whole.
				frame := fmt.Sprintf(`{"w":%d,"j":%d,"pad":%q}`, i, j, strings.Repeat("p", 10000))
				if err := s.WriteMessage(context.Background(), []byte(frame)); err != nil {
					t.Errorf("write: %v", err)
				}
			}
		})
	}
	go func() { wg.Wait(); w.Close() }()
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	n := 0
	for sc.Scan() {
		if !json.Valid(sc.Bytes()) {
			t.Fatalf("line %d is not whole JSON: %.80q", n, sc.Bytes())
		}
		n++
	}
	if n != writers*each {
		t.Errorf("read %d lines, want %d", n, writers*each)
	}
}

func TestLineStreamWrite(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		frame   string
		want    string
		wantErr bool
	}{
		{name: "one line", frame: `{"a":1}`, want: "{\"a\":1}\n"},
		{name: "newlines are compacted away", frame: "{\n  \"a\": \"x\\ny\"\n}", want: "{\"a\":\"x\\ny\"}\n"},
		{name: "invalid JSON with a newline", frame: "{\n", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var out strings.Builder
			s := NewLineStream(strings.NewReader(""), nopWriteCloser{&out}, 0)
			err := s.WriteMessage(t.Context(), []byte(tt.frame))
			if (err != nil) != tt.wantErr {
				t.Fatalf("WriteMessage error = %v, wantErr %v", err, tt.wantErr)
			}
			if out.String() != tt.want {
				t.Errorf("wrote %q, want %q", out.String(), tt.want)
			}
		})
	}
}

func TestLineStreamWriteGivesUpWaiting(t *testing.T) {
	t.Parallel()
	r, w := io.Pipe()
	s := NewLineStream(strings.NewReader(""), w, 0)
	first := make(chan error, 1)
	go func() { first <- s.WriteMessage(context.Background(), []byte(`{}`)) }()
	// The first write holds the stream until someone reads; wait until it
	// is inside the pipe.
	buf := make([]byte, 1)
	if _, err := r.Read(buf); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := s.WriteMessage(ctx, []byte(`{}`)); !errors.Is(err, context.Canceled) {
		t.Errorf("second write = %v, want context.Canceled", err)
	}
	if _, err := io.ReadFull(r, make([]byte, 2)); err != nil {
		t.Fatal(err)
	}
	if err := <-first; err != nil {
		t.Errorf("first write: %v", err)
	}
}

func TestLineStreamCloseUnblocksRead(t *testing.T) {
	t.Parallel()
	r, w := io.Pipe()
	s := NewLineStream(r, w, 0)
	errc := make(chan error, 1)
	go func() {
		_, err := s.ReadMessage(t.Context())
		errc <- err
	}()
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := <-errc; !errors.Is(err, io.ErrClosedPipe) {
		t.Errorf("read after Close = %v, want io.ErrClosedPipe", err)
	}
}

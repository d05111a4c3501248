package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	covenpb "github.com/conclave-ai/conclave/proto/coven"
)

var fixedNow = func() time.Time { return time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC) }

// kind names a response's event for compact comparisons.
func kind(r *covenpb.MessageResponse) string {
	return strings.TrimPrefix(fmt.Sprintf("%T", r.GetEvent()), "*covenpb.MessageResponse_")
}

func kinds(rs []*covenpb.MessageResponse) string {
	ks := make([]string, len(rs))
	for i, r := range rs {
		ks[i] = kind(r)
	}
	return strings.Join(ks, " ")
}

func TestReplyStreamsEveryEventInOrder(t *testing.T) {
	t.Parallel()
	msg := &covenpb.SendMessage{RequestId: "req-1", Sender: "ada", Content: "the quick brown fox jumps",
		Attachments: []*covenpb.FileAttachment{{Filename: "notes.md"}}}
	var got []*covenpb.MessageResponse
	err := replier{now: fixedNow}.reply(context.Background(), msg, func(r *covenpb.MessageResponse) error {
		got = append(got, r)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	const want = "Thinking Text Text Text ToolUse ToolResult Text File Done"
	if kinds(got) != want {
		t.Fatalf("events = %s\nwant     %s", kinds(got), want)
	}
	var text strings.Builder
	for _, r := range got {
		if r.GetRequestId() != "req-1" {
			t.Errorf("%s has request_id %q", kind(r), r.GetRequestId())
		}
		text.WriteString(r.GetText())
	}
	if th := got[0].GetThinking(); !strings.Contains(th, "ada") || !strings.Contains(th, "notes.md") {
		t.Errorf("thinking = %q, want the sender and the attachment named", th)
	}
	if !strings.HasPrefix(text.String(), "You said: the quick brown fox jumps") {
		t.Errorf("text = %q, want the content echoed", text.String())
	}
	use, res := got[4].GetToolUse(), got[5].GetToolResult()
	if use.GetName() != "clock" || use.GetInputJson() != `{"timezone":"UTC"}` || use.GetId() == "" || res.GetId() != use.GetId() {
		t.Errorf("tool_use = %v, tool_result = %v", use, res)
	}
	if res.GetOutput() != "2026-03-04T05:06:07Z" || res.GetIsError() {
		t.Errorf("tool_result = %v, want the fixed clock", res)
	}
	if f := got[7].GetFile(); f.GetFilename() != "echo.txt" || f.GetMimeType() != "text/plain" || string(f.GetData()) != msg.Content+"\n" {
		t.Errorf("file = %v", f)
	}
	if full := got[8].GetDone().GetFullResponse(); full != text.String() {
		t.Errorf("full_response = %q, want the streamed text %q", full, text.String())
	}
}

func TestReplyStopsWithCancelledWhenCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	var got []*covenpb.MessageResponse
	err := replier{now: fixedNow}.reply(ctx, &covenpb.SendMessage{RequestId: "r", Content: "a b c d e f"},
		func(r *covenpb.MessageResponse) error {
			got = append(got, r)
			if r.GetText() != "" {
				cancel(errors.New("user pressed stop"))
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if kinds(got) != "Thinking Text Cancelled" {
		t.Fatalf("events = %s, want the reply cut short by cancelled", kinds(got))
	}
	if c := got[2]; c.GetCancelled().GetReason() != "user pressed stop" || c.GetRequestId() != "r" {
		t.Errorf("cancelled = %v, want the cause as the reason", c)
	}
}

func TestReplyReturnsEmitFailure(t *testing.T) {
	t.Parallel()
	broken := errors.New("stream gone")
	calls := 0
	err := replier{now: fixedNow}.reply(context.Background(), &covenpb.SendMessage{RequestId: "r"},
		func(*covenpb.MessageResponse) error { calls++; return broken })
	if !errors.Is(err, broken) {
		t.Fatalf("err = %v, want it to wrap the emit failure", err)
	}
	if calls != 1 {
		t.Errorf("emit called %d times after failing, want it to stop at once", calls)
	}
}

func TestChunks(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"", "one", "You said: hi", "a b c d e f g", "double  space "} {
		got := chunks(s, 3)
		if strings.Join(got, "") != s || len(got) > 3 || len(got) == 0 {
			t.Errorf("chunks(%q, 3) = %q", s, got)
		}
	}
}

func TestBackoffGrowsToItsCapWithJitterAndResets(t *testing.T) {
	t.Parallel()
	b := backoff{min: 100 * time.Millisecond, max: time.Second}
	windows := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, w := range windows {
		w *= time.Millisecond
		if d := b.next(); d < w/2 || d > w {
			t.Errorf("wait %d = %s, want within [%s, %s]", i, d, w/2, w)
		}
	}
	b.reset()
	if d := b.next(); d > 100*time.Millisecond {
		t.Errorf("after reset, wait = %s, want the minimum window", d)
	}
}

func TestNewIDIsAUUIDv4(t *testing.T) {
	t.Parallel()
	id := NewID()
	if len(id) != 36 || id[14] != '4' || !strings.ContainsRune("89ab", rune(id[19])) || strings.Count(id, "-") != 4 {
		t.Errorf("NewID() = %q, want a version-4 UUID", id)
	}
	if NewID() == id {
		t.Error("NewID repeated itself")
	}
}

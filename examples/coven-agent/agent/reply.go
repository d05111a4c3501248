package agent

import (
	"context"
	"fmt"
	"strings"
	"time"

	covenpb "github.com/conclave-ai/conclave/proto/coven"
)

// emitFunc sends one event of a reply to the gateway.
type emitFunc func(*covenpb.MessageResponse) error

// replier answers a message with a scripted reply that uses every event a
// client has to render: thinking, streamed text, a tool call and its result,
// a file, and done. A real agent would put its model behind the same shape.
type replier struct {
	// delay paces the events so that streaming, and cancelling halfway, can
	// be seen from a terminal.
	delay time.Duration
	now   func() time.Time
}

// reply streams the answer to m through emit. When ctx ends first it emits
// cancelled, with ctx's cause as the reason, and stops: a request always
// ends with done or cancelled. It returns an error only when emit fails, that
// is when the stream is gone and nothing more can be said.
func (r replier) reply(ctx context.Context, m *covenpb.SendMessage, emit emitFunc) error {
	id := m.GetRequestId()
	send := func(ev *covenpb.MessageResponse) error {
		ev.RequestId = id
		if err := emit(ev); err != nil {
			return fmt.Errorf("request %s: %w", id, err)
		}
		return nil
	}
	for _, next := range r.script(m) {
		if err := r.pause(ctx); err != nil {
			return send(&covenpb.MessageResponse{Event: &covenpb.MessageResponse_Cancelled{
				Cancelled: &covenpb.Cancelled{Reason: context.Cause(ctx).Error()},
			}})
		}
		if err := send(next()); err != nil {
			return err
		}
	}
	return nil
}

// script is the reply to m, one function per event. Events are built as they
// are sent, so the tool runs only once its use has been announced, as a real
// one would.
func (r replier) script(m *covenpb.SendMessage) []func() *covenpb.MessageResponse {
	var full strings.Builder
	text := func(s string) func() *covenpb.MessageResponse {
		return func() *covenpb.MessageResponse {
			full.WriteString(s)
			return &covenpb.MessageResponse{Event: &covenpb.MessageResponse_Text{Text: s}}
		}
	}
	steps := []func() *covenpb.MessageResponse{
		func() *covenpb.MessageResponse {
			return &covenpb.MessageResponse{Event: &covenpb.MessageResponse_Thinking{Thinking: thinking(m)}}
		},
	}
	for _, c := range chunks("You said: "+m.GetContent(), 3) {
		steps = append(steps, text(c))
	}
	toolID := m.GetRequestId() + "/clock"
	var clock string
	return append(steps,
		func() *covenpb.MessageResponse {
			return &covenpb.MessageResponse{Event: &covenpb.MessageResponse_ToolUse{ToolUse: &covenpb.ToolUse{
				Id: toolID, Name: "clock", InputJson: `{"timezone":"UTC"}`,
			}}}
		},
		func() *covenpb.MessageResponse {
			clock = r.now().UTC().Format(time.RFC3339)
			return &covenpb.MessageResponse{Event: &covenpb.MessageResponse_ToolResult{ToolResult: &covenpb.ToolResult{
				Id: toolID, Output: clock,
			}}}
		},
		func() *covenpb.MessageResponse { return text("\nThe clock says " + clock + ".")() },
		func() *covenpb.MessageResponse {
			return &covenpb.MessageResponse{Event: &covenpb.MessageResponse_File{File: &covenpb.FileData{
				Filename: "echo.txt", MimeType: "text/plain", Data: []byte(m.GetContent() + "\n"),
			}}}
		},
		func() *covenpb.MessageResponse {
			return &covenpb.MessageResponse{Event: &covenpb.MessageResponse_Done{Done: &covenpb.Done{FullResponse: full.String()}}}
		},
	)
}

// pause waits the step delay, and reports ctx's end, which is checked even
// without a delay so that a cancelled request stops at its next event.
func (r replier) pause(ctx context.Context) error {
	if r.delay > 0 {
		t := time.NewTimer(r.delay)
		defer t.Stop()
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
	return ctx.Err()
}

func thinking(m *covenpb.SendMessage) string {
	from := m.GetSender()
	if from == "" {
		from = "someone"
	}
	s := fmt.Sprintf("Reading a message from %s", from)
	if n := len(m.GetAttachments()); n > 0 {
		names := make([]string, 0, n)
		for _, a := range m.GetAttachments() {
			names = append(names, a.GetFilename())
		}
		s += fmt.Sprintf(" with %d attachment(s): %s", n, strings.Join(names, ", "))
	}
	return s
}

// chunks cuts s into at most n pieces at word boundaries; joined, they give
// s back exactly, spaces included.
func chunks(s string, n int) []string {
	words := strings.SplitAfter(s, " ")
	per := (len(words) + n - 1) / n
	var out []string
	for len(words) > 0 {
		k := min(per, len(words))
		out = append(out, strings.Join(words[:k], ""))
		words = words[k:]
	}
	return out
}

package web

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/conclave-ai/conclave/pkg/ids"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
	"github.com/conclave-ai/conclave/services/console/internal/session"
)

// ---- threads: the gateway's stored conversations ----

type threadsData struct {
	AgentID string
	List    []*gatewayv1.Thread
}

// threads lists an agent's threads the session's gateway token may read.
func (h *Handler) threads(w http.ResponseWriter, r *http.Request, s session.Session) {
	agentID := r.PathValue("id")
	if !h.checkID(w, r, ids.AgentID, agentID) {
		return
	}
	list, err := h.o.Gateway.ListThreads(r.Context(), s.Tokens.Gateway, agentID)
	if err != nil {
		h.backendProblem(w, r, err)
		return
	}
	h.render(w, r, http.StatusOK, "threads", s, page{Title: "Threads with " + agentID, Section: "agents", D: threadsData{AgentID: agentID, List: list}})
}

// turn is one request of a thread as the page shows it: the client's
// message, the agent's answer, and how it ended.
type turn struct {
	RequestID, AgentID   string
	Sender, ClientID     string
	Content              string
	Attachments          []string
	At                   string
	Events               []chatEvent
	Ending, EndingDetail string
}

type threadData struct {
	ThreadID string
	Turns    []*turn
	More     bool // the thread has more entries than the page shows
}

// thread shows a thread as a conversation.
func (h *Handler) thread(w http.ResponseWriter, r *http.Request, s session.Session) {
	threadID := r.PathValue("id")
	if !h.checkID(w, r, ids.ThreadID, threadID) {
		return
	}
	entries, more, err := h.o.Gateway.History(r.Context(), s.Tokens.Gateway, threadID)
	if err != nil {
		h.backendProblem(w, r, err)
		return
	}
	h.render(w, r, http.StatusOK, "thread", s, page{Title: "Thread " + threadID, Section: "agents",
		D: threadData{ThreadID: threadID, Turns: turnsOf(entries), More: more}})
}

// turnsOf groups a thread's entries by request, in order. Entries of a
// request whose message is not among them (it expired first) make a turn
// of their own.
func turnsOf(entries []*gatewayv1.ThreadEntry) []*turn {
	var turns []*turn
	byRequest := map[string]*turn{}
	for _, e := range entries {
		t := byRequest[e.GetRequestId()]
		if t == nil {
			t = &turn{RequestID: e.GetRequestId(), AgentID: e.GetAgentId(), At: formatProtoTime(e.GetTime())}
			byRequest[e.GetRequestId()] = t
			turns = append(turns, t)
		}
		switch x := e.GetEntry().(type) {
		case *gatewayv1.ThreadEntry_Message:
			m := x.Message
			t.Sender, t.ClientID, t.Content = m.GetSender(), m.GetClientId(), m.GetContent()
			for _, a := range m.GetAttachments() {
				t.Attachments = append(t.Attachments, fmt.Sprintf("%s (%s, %d bytes)", a.GetFilename(), a.GetMimeType(), a.GetSize()))
			}
		case *gatewayv1.ThreadEntry_Event:
			ev := eventOf(&gatewayv1.SendMessageResponse{Event: x.Event})
			if f := e.GetFile(); f != nil {
				// The history keeps a file's name and size, not its data.
				ev = chatEvent{Kind: "file", Name: f.GetFilename(), Text: fmt.Sprintf("%s, %d bytes (not kept)", f.GetMimeType(), f.GetSize())}
			}
			t.Events = append(t.Events, ev)
		case *gatewayv1.ThreadEntry_Outcome:
			t.Ending = strings.ToLower(strings.TrimPrefix(x.Outcome.GetEnding().String(), "ENDING_"))
			t.EndingDetail = x.Outcome.GetMessage()
		}
	}
	return turns
}

package web

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/conclave-ai/conclave/pkg/auth"
	"github.com/conclave-ai/conclave/pkg/ids"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
	librarianv1 "github.com/conclave-ai/conclave/proto/conclave/librarian/v1"
	runnerv1 "github.com/conclave-ai/conclave/proto/conclave/runner/v1"
	"github.com/conclave-ai/conclave/services/console/internal/backend"
	"github.com/conclave-ai/conclave/services/console/internal/metrics"
	"github.com/conclave-ai/conclave/services/console/internal/session"
)

// panel is one service's part of a page: its data, or why it has none.
type panel struct {
	Service string
	// Down is set when the service could not answer: the page shows a
	// banner in place of the panel's content, and the other panels go on.
	Down string
	// Refused is set when the service refused the session's token.
	Refused string
}

func panelOf(service string, err error) panel {
	p := panel{Service: service}
	switch {
	case err == nil:
	case backend.IsKind(err, backend.Unauthorized):
		p.Refused = err.Error()
	default:
		p.Down = err.Error()
	}
	return p
}

// ---- sign-in ----

type signinData struct {
	Next    string
	Expired bool
	Errors  []string
	// CSRF is the sign-in form's own token, the value of its pre-session
	// cookie: without a session, the session's token cannot serve.
	CSRF string
}

// signinToken is the sign-in form's token: the one the browser's
// pre-session cookie holds, or a new one set in that cookie.
func (h *Handler) signinToken(w http.ResponseWriter, r *http.Request) string {
	if ck, err := r.Cookie(session.SignInCookieName); err == nil && len(ck.Value) == 43 {
		return ck.Value
	}
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	tok := base64.RawURLEncoding.EncodeToString(b)
	http.SetCookie(w, h.o.Codec.SignInCookie(tok))
	return tok
}

// signinFromThisConsole checks a sign-in post: its hidden token must
// match the pre-session cookie (compared in constant time), and it must
// not come from another origin, nor from an opaque one ("Origin: null",
// a sandboxed frame or a redirect chain another site started).
func signinFromThisConsole(r *http.Request) bool {
	if r.Header.Get("Origin") == "null" || !sameOrigin(r) {
		return false
	}
	ck, err := r.Cookie(session.SignInCookieName)
	if err != nil || ck.Value == "" {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(ck.Value), []byte(r.PostForm.Get("signin_csrf"))) == 1
}

func (h *Handler) signinForm(w http.ResponseWriter, r *http.Request) {
	s, err := h.o.Codec.Read(r)
	if err != nil {
		s = session.Session{ID: "signin"} // no session yet: the form carries its own token (signinToken)
	}
	h.render(w, r, http.StatusOK, "signin", s, page{Title: "Sign in", D: signinData{
		Next: safeNext(r.URL.Query().Get("next")), Expired: r.URL.Query().Get("expired") == "1", CSRF: h.signinToken(w, r)}})
}

func (h *Handler) signin(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	if err := r.ParseForm(); err != nil {
		h.problem(w, r, http.StatusBadRequest, "The form could not be read.")
		return
	}
	if !signinFromThisConsole(r) {
		h.o.Metrics.Refused(metrics.RefusedCSRF)
		h.problem(w, r, http.StatusForbidden, "The sign-in form has expired or did not come from this console; reload the sign-in page and try again.")
		return
	}
	field := func(name string) string { return strings.TrimSpace(r.PostForm.Get(name)) }
	tokens := session.Tokens{
		Gateway: field("gateway_token"), Bus: field("bus_token"), Runner: field("runner_token"),
		Reviewer: field("reviewer_token"), LibrarianAgent: field("librarian_agent_token"),
	}
	next := safeNext(r.PostForm.Get("next"))
	var problems []string
	for _, f := range []struct{ name, v string }{{"the gateway token", tokens.Gateway}, {"the bus token", tokens.Bus},
		{"the runner token", tokens.Runner}, {"the reviewer token", tokens.Reviewer}, {"the Librarian agent token", tokens.LibrarianAgent}} {
		if f.v == "" {
			continue
		}
		if err := validText(f.name, f.v, session.MaxTokenBytes); err != nil {
			problems = append(problems, err.Error())
		}
	}
	if len(problems) == 0 && tokens != (session.Tokens{}) {
		if wait := h.o.SignInThrottle.Refused(r.Context(), r.RemoteAddr); wait > 0 {
			h.o.Metrics.Refused(metrics.RefusedSignIn)
			w.Header().Set("Retry-After", auth.RetryAfter(wait))
			h.problem(w, r, http.StatusTooManyRequests, "Too many refused tokens came from this address; wait "+auth.RetryAfter(wait)+" s and sign in again.")
			return
		}
		if problems = h.checkTokens(r.Context(), tokens); len(problems) > 0 {
			h.o.SignInThrottle.Fail(r.RemoteAddr)
		}
	}
	if tokens == (session.Tokens{}) && !h.o.Open {
		problems = append(problems, "Give at least one token.")
	}
	if len(problems) > 0 {
		h.o.Metrics.Refused(metrics.RefusedSignIn)
		h.render(w, r, http.StatusUnauthorized, "signin", session.Session{ID: "signin"}, page{Title: "Sign in", D: signinData{Next: next, Errors: problems, CSRF: h.signinToken(w, r)}})
		return
	}
	s := h.o.Codec.New(tokens, tokens == (session.Tokens{}))
	ck, err := h.o.Codec.Cookie(s)
	if err != nil {
		h.problem(w, r, http.StatusInternalServerError, "The session could not be created.")
		return
	}
	http.SetCookie(w, ck)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// checkTokens asks each service whether it accepts the token given for
// it. A service that cannot be reached now is no reason to refuse the
// sign-in: its panel will say so.
func (h *Handler) checkTokens(ctx context.Context, t session.Tokens) []string {
	var (
		mu       sync.Mutex
		wg       sync.WaitGroup
		problems []string
	)
	check := func(token, what string, call func() error) {
		if token == "" {
			return
		}
		wg.Go(func() {
			if err := call(); backend.IsKind(err, backend.Unauthorized) {
				mu.Lock()
				problems = append(problems, "The "+what+" refused its token: "+err.Error())
				mu.Unlock()
			}
		})
	}
	check(t.Gateway, "gateway", func() error { _, err := h.o.Gateway.ListAgents(ctx, t.Gateway); return err })
	check(t.Runner, "runner", func() error { _, err := h.o.Runner.AgentTypes(ctx, t.Runner); return err })
	check(t.Reviewer, "Librarian (as a reviewer)", func() error { _, err := h.o.Librarian.Reviews(ctx, t.Reviewer); return err })
	check(t.Bus, "bus", func() error {
		_, _, err := h.o.Bus.DeadLetters(ctx, t.Bus, "", 1)
		if backend.StatusOf(err) == http.StatusForbidden {
			return nil // a token that is not an admin's may still watch topics
		}
		return err
	})
	wg.Wait()
	sort.Strings(problems)
	return problems
}

func (h *Handler) signout(w http.ResponseWriter, r *http.Request, _ session.Session) {
	http.SetCookie(w, h.o.Codec.Clear())
	http.Redirect(w, r, "/signin", http.StatusSeeOther)
}

// ---- overview ----

type overviewData struct {
	Agents      panel
	AgentList   []*gatewayv1.Agent
	Bus         panel
	DeadLetters []backend.DeadLetter
	Runner      panel
	Instances   []instanceRow
	Librarian   panel
	Reviews     []*librarianv1.RequestStatus
}

func (h *Handler) overview(w http.ResponseWriter, r *http.Request, s session.Session) {
	ctx := r.Context()
	var d overviewData
	var wg sync.WaitGroup
	wg.Go(func() {
		agents, err := h.o.Gateway.ListAgents(ctx, s.Tokens.Gateway)
		d.Agents, d.AgentList = panelOf("gateway", err), agents
	})
	wg.Go(func() {
		dls, _, err := h.o.Bus.DeadLetters(ctx, s.Tokens.Bus, "", 20)
		d.Bus, d.DeadLetters = panelOf("bus", err), dls
	})
	wg.Go(func() {
		rows, _, err := h.instanceRows(ctx, s, overviewInstances, "")
		d.Runner, d.Instances = panelOf("runner", err), rows
	})
	wg.Go(func() {
		reviews, err := h.o.Librarian.Reviews(ctx, s.Tokens.Reviewer)
		d.Librarian, d.Reviews = panelOf("librarian", err), reviews
	})
	wg.Wait()
	h.render(w, r, http.StatusOK, "overview", s, page{Title: "Overview", Section: "overview", D: d})
}

// ---- agents and chat ----

type agentsData struct {
	Agents panel
	List   []*gatewayv1.Agent
	// Selected is the agent the chat form starts with.
	Selected string
}

func (h *Handler) agents(w http.ResponseWriter, r *http.Request, s session.Session) {
	list, err := h.o.Gateway.ListAgents(r.Context(), s.Tokens.Gateway)
	h.render(w, r, http.StatusOK, "agents", s, page{Title: "Agents", Section: "agents",
		D: agentsData{Agents: panelOf("gateway", err), List: list, Selected: r.URL.Query().Get("agent")}})
}

// maxMessageBytes is the gateway's own limit on a message's content.
const maxMessageBytes = 256 << 10

func (h *Handler) startChat(w http.ResponseWriter, r *http.Request, s session.Session) {
	agentID := strings.TrimSpace(r.PostForm.Get("agent_id"))
	content := r.PostForm.Get("content")
	if !h.checkID(w, r, ids.AgentID, agentID) {
		return
	}
	if strings.TrimSpace(content) == "" || len(content) > maxMessageBytes {
		h.problem(w, r, http.StatusBadRequest, "The message must be 1 byte to 256 KiB long.")
		return
	}
	// The chat outlives this request (the page reads it through its own
	// stream) but not the console: it runs under the console's context,
	// in this request's trace.
	ctx, traceID := backend.WithTrace(r.Context())
	runCtx, cancel := context.WithTimeout(contextWithSpan(h.base, ctx), h.o.ChatTimeout)
	c := &chat{ID: newChatID(), Owner: s.ID, AgentID: agentID, Content: content, TraceID: traceID,
		Started: timeNow(), cancelRun: cancel, changed: make(chan struct{})}
	if err := h.chats.add(c); err != nil {
		cancel()
		h.o.Metrics.Refused(metrics.RefusedBusy)
		h.problem(w, r, http.StatusServiceUnavailable, err.Error())
		return
	}
	token := s.Tokens.Gateway
	go func() {
		defer cancel()
		req := &gatewayv1.SendMessageRequest{AgentId: agentID, Content: content, Sender: "console", ThreadId: c.ThreadID()}
		err := h.o.Gateway.SendMessage(runCtx, token, req, func(m *gatewayv1.SendMessageResponse) {
			if id := m.GetRequestId(); id != "" {
				c.setRequestID(id)
			}
			if m.GetEvent().GetEvent() != nil {
				c.add(eventOf(m))
			}
		})
		switch {
		case err == nil:
			c.finish(chatEvent{Kind: "end"})
		case errors.Is(runCtx.Err(), context.DeadlineExceeded):
			c.finish(chatEvent{Kind: "failed", Text: "the chat took longer than the console allows (CONCLAVE_CONSOLE_CHAT_TIMEOUT)"})
		case runCtx.Err() != nil:
			c.finish(chatEvent{Kind: "failed", Text: "stopped: the console is shutting down or the chat was abandoned"})
		default:
			c.finish(chatEvent{Kind: "failed", Text: err.Error()})
		}
	}()
	if wantsJSON(r) {
		writeJSON(w, http.StatusCreated, map[string]string{"chat_id": c.ID, "events": "/chats/" + c.ID + "/events",
			"cancel": "/chats/" + c.ID + "/cancel", "trace_id": traceID, "trace_url": h.traceURL(traceID)})
		return
	}
	http.Redirect(w, r, "/chats/"+c.ID, http.StatusSeeOther)
}

type chatData struct {
	Chat   *chat
	Events []chatEvent
	Done   bool
}

func (h *Handler) showChat(w http.ResponseWriter, r *http.Request, s session.Session) {
	c, ok := h.chats.get(r.PathValue("id"), s.ID)
	if !ok {
		h.problem(w, r, http.StatusNotFound, "There is no such chat in this session; chats are kept in the console's memory for a while only.")
		return
	}
	evs, done := c.Snapshot()
	h.render(w, r, http.StatusOK, "chat", s, page{Title: "Chat with " + c.AgentID, Section: "agents", D: chatData{Chat: c, Events: evs, Done: done}})
}

func (h *Handler) cancelChat(w http.ResponseWriter, r *http.Request, s session.Session) {
	c, ok := h.chats.get(r.PathValue("id"), s.ID)
	if !ok {
		h.problem(w, r, http.StatusNotFound, "There is no such chat in this session.")
		return
	}
	if _, done := c.Snapshot(); done {
		h.problem(w, r, http.StatusConflict, "The reply has already ended.")
		return
	}
	if id := c.RequestID(); id != "" {
		// The gateway tells the agent, which ends the reply with cancelled.
		if _, err := h.o.Gateway.Cancel(r.Context(), s.Tokens.Gateway, id, "cancelled from the console"); err != nil {
			h.backendProblem(w, r, err)
			return
		}
	} else {
		c.cancelRun() // not yet dispatched: leaving the stream cancels it
	}
	if wantsJSON(r) {
		writeJSON(w, http.StatusOK, map[string]bool{"cancelling": true})
		return
	}
	http.Redirect(w, r, "/chats/"+c.ID, http.StatusSeeOther)
}

// ---- runner ----

type instanceRow struct {
	knownInstance
	Status    string
	Progress  int32
	StartedAt time.Time
}

// Page sizes of the runner's instance list on the overview and the runner
// page.
const (
	overviewInstances = 10
	runnerInstances   = 50
)

// instanceRows reads a page of the runner's instances, newest first
// (after the page pageToken continues), and the token of the next. Every
// runner token may read every instance's status, so the runner lists them
// all to any session it accepts; the trace of a launch or prompt made from
// this session is added to its row.
func (h *Handler) instanceRows(ctx context.Context, s session.Session, size int, pageToken string) ([]instanceRow, string, error) {
	page, err := h.o.Runner.List(ctx, s.Tokens.Runner, size, pageToken)
	if err != nil {
		return nil, "", err
	}
	rows := make([]instanceRow, 0, len(page.GetInstances()))
	for _, in := range page.GetInstances() {
		row := instanceRow{knownInstance: knownInstance{Owner: s.ID, ID: in.GetId(), TaskID: in.GetTaskId(), AgentType: in.GetAgentType()},
			Status: in.GetStatus(), Progress: in.GetProgress()}
		if in.GetStartedAt() != nil {
			row.StartedAt = in.GetStartedAt().AsTime()
		}
		if k, ok := h.instances.get(instanceKey(s.ID, in.GetId())); ok {
			row.TraceID = k.TraceID
		}
		rows = append(rows, row)
	}
	return rows, page.GetNextPageToken(), nil
}

type runnerData struct {
	Runner    panel
	Types     []*runnerv1.AgentType
	Instances []instanceRow
	// Page is the page token this page was asked with (empty: the first),
	// Next the one of the page after it.
	Page, Next string
}

// maxPageToken bounds a page token the console passes on to the runner.
const maxPageToken = 1024

func (h *Handler) runner(w http.ResponseWriter, r *http.Request, s session.Session) {
	d := runnerData{Page: r.URL.Query().Get("page")}
	if len(d.Page) > maxPageToken {
		h.problem(w, r, http.StatusBadRequest, "The page token is not one the runner gave.")
		return
	}
	var typesErr, rowsErr error
	var wg sync.WaitGroup
	wg.Go(func() { d.Types, typesErr = h.o.Runner.AgentTypes(r.Context(), s.Tokens.Runner) })
	wg.Go(func() { d.Instances, d.Next, rowsErr = h.instanceRows(r.Context(), s, runnerInstances, d.Page) })
	wg.Wait()
	d.Types = enabledTypes(d.Types)
	d.Runner = panelOf("runner", errors.Join(typesErr, rowsErr))
	if typesErr != nil {
		d.Runner = panelOf("runner", typesErr)
	}
	h.render(w, r, http.StatusOK, "runner", s, page{Title: "Runner", Section: "runner", Flash: flash(r), D: d})
}

func enabledTypes(types []*runnerv1.AgentType) []*runnerv1.AgentType {
	out := types[:0:0]
	for _, t := range types {
		if t.GetEnabled() {
			out = append(out, t)
		}
	}
	return out
}

func (h *Handler) findInstance(w http.ResponseWriter, r *http.Request, _ session.Session) {
	id := strings.TrimSpace(r.URL.Query().Get("id"))
	if !h.checkID(w, r, ids.InstanceID, id) {
		return
	}
	http.Redirect(w, r, "/runner/instances/"+pathEscape(id), http.StatusSeeOther)
}

func (h *Handler) launch(w http.ResponseWriter, r *http.Request, s session.Session) {
	f := func(k string) string { return strings.TrimSpace(r.PostForm.Get(k)) }
	l := backend.Launch{AgentType: f("agent_type"), WorkspacePath: f("workspace_path"), TaskID: f("task_id")}
	for _, check := range []error{validText("The agent type", l.AgentType, 128), validText("The workspace path", l.WorkspacePath, 4096)} {
		if check != nil {
			h.problem(w, r, http.StatusBadRequest, check.Error())
			return
		}
	}
	if l.TaskID == "" {
		// The runner needs one; like `conclave runner launch`, make it.
		l.TaskID = "console-" + newChatID()[:16]
	} else if !h.checkID(w, r, ids.TaskID, l.TaskID) {
		return
	}
	if prompt := r.PostForm.Get("prompt"); strings.TrimSpace(prompt) != "" {
		if len(prompt) > maxMessageBytes {
			h.problem(w, r, http.StatusBadRequest, "The prompt is longer than 256 KiB.")
			return
		}
		// The runner gives an agent its task as TASK_DESCRIPTION, as
		// `conclave runner launch --prompt` does.
		l.Env = map[string]string{"TASK_DESCRIPTION": prompt}
	}
	in, traceID, err := h.o.Runner.Launch(r.Context(), s.Tokens.Runner, l)
	if err != nil {
		h.backendProblem(w, r, err)
		return
	}
	h.instances.add(knownInstance{Owner: s.ID, ID: in.GetId(), TaskID: in.GetTaskId(), AgentType: in.GetAgentType(), TraceID: traceID, Seen: timeNow()})
	http.Redirect(w, r, "/runner/instances/"+pathEscape(in.GetId())+"?done=launched", http.StatusSeeOther)
}

// instanceID is the request's instance id, or "" after answering 400.
func (h *Handler) instanceID(w http.ResponseWriter, r *http.Request) string {
	id := r.PathValue("id")
	if !h.checkID(w, r, ids.InstanceID, id) {
		return ""
	}
	return id
}

type instanceData struct {
	Runner   panel
	Instance *runnerv1.AgentInstance
	Known    knownInstance
}

func (h *Handler) instance(w http.ResponseWriter, r *http.Request, s session.Session) {
	id := h.instanceID(w, r)
	if id == "" {
		return
	}
	in, err := h.o.Runner.Status(r.Context(), s.Tokens.Runner, id)
	if backend.IsKind(err, backend.Rejected) {
		h.problem(w, r, backend.StatusOf(err), err.Error())
		return
	}
	known, ok := h.instances.get(instanceKey(s.ID, id))
	if err == nil && !ok {
		known = knownInstance{Owner: s.ID, ID: in.GetId(), TaskID: in.GetTaskId(), AgentType: in.GetAgentType(), Seen: timeNow()}
		h.instances.add(known)
	}
	if known.ID == "" {
		known.ID = id
	}
	h.render(w, r, http.StatusOK, "instance", s, page{Title: "Instance " + id, Section: "runner", Flash: flash(r),
		D: instanceData{Runner: panelOf("runner", err), Instance: in, Known: known}})
}

func (h *Handler) prompt(w http.ResponseWriter, r *http.Request, s session.Session) {
	id := h.instanceID(w, r)
	if id == "" {
		return
	}
	msg := r.PostForm.Get("message")
	if strings.TrimSpace(msg) == "" || len(msg) > maxMessageBytes {
		h.problem(w, r, http.StatusBadRequest, "The prompt must be 1 byte to 256 KiB long.")
		return
	}
	traceID, err := h.o.Runner.Prompt(r.Context(), s.Tokens.Runner, id, msg)
	if err != nil {
		h.backendProblem(w, r, err)
		return
	}
	if k, ok := h.instances.get(instanceKey(s.ID, id)); ok {
		k.TraceID = traceID
		h.instances.add(k)
	}
	http.Redirect(w, r, "/runner/instances/"+pathEscape(id)+"?done=prompted", http.StatusSeeOther)
}

func (h *Handler) cancelInstance(w http.ResponseWriter, r *http.Request, s session.Session) {
	id := h.instanceID(w, r)
	if id == "" {
		return
	}
	if err := h.o.Runner.Cancel(r.Context(), s.Tokens.Runner, id, "cancelled from the console"); err != nil {
		h.backendProblem(w, r, err)
		return
	}
	http.Redirect(w, r, "/runner/instances/"+pathEscape(id)+"?done=cancelled", http.StatusSeeOther)
}

// ---- Librarian ----

// recentDecisions is how many of the Librarian's decisions its page shows.
const recentDecisions = 20

// listedDecisions are the Librarian's decisions as its page shows them,
// with the trace of those made from this console or announced on the bus.
func (h *Handler) listedDecisions(listed []*librarianv1.DecidedRequest) []decision {
	out := make([]decision, 0, len(listed))
	for _, l := range listed {
		d := decision{RequestID: l.GetRequestId(), AgentID: l.GetAgentId(), Outcome: l.GetDecision(), Source: "librarian",
			DecidedBy: l.GetDecidedBy(), Reviewer: l.GetReviewer(), Comment: l.GetComment()}
		if l.GetDecidedAt() != nil {
			d.At = l.GetDecidedAt().AsTime()
		}
		// The bus announces clarification_needed as a rejection.
		seen := d
		if seen.Outcome == "clarification_needed" {
			seen.Outcome = "rejected"
		}
		if k, ok := h.decisions.get(seen.key()); ok {
			d.TraceID = k.TraceID
		}
		out = append(out, d)
	}
	return out
}

type librarianData struct {
	Reviews   panel
	Queue     []*librarianv1.RequestStatus
	Decisions []decision
	// DecisionsProblem is why the Librarian did not list its decisions;
	// Decisions are then those this console made or saw on the bus.
	DecisionsProblem string
	// ShowDecisions is set when the Librarian accepted the session as a
	// reviewer.
	ShowDecisions bool
	Query         string
	Search        panel
	Searched      bool
	Nodes         []*librarianv1.NodeSummary
	SearchAs      string
}

func (h *Handler) librarian(w http.ResponseWriter, r *http.Request, s session.Session) {
	d := librarianData{Query: strings.TrimSpace(r.URL.Query().Get("q")), SearchAs: h.o.LibrarianAgentID}
	var wg sync.WaitGroup
	wg.Go(func() {
		q, err := h.o.Librarian.Reviews(r.Context(), s.Tokens.Reviewer)
		d.Reviews, d.Queue = panelOf("librarian", err), q
		// The decisions are the reviewers' business: only a session the
		// Librarian accepts as a reviewer sees them.
		if err != nil {
			return
		}
		d.ShowDecisions = true
		listed, err := h.o.Librarian.Decided(r.Context(), s.Tokens.Reviewer, recentDecisions)
		if err != nil {
			// A Librarian without the list (an older one): what this
			// console made or saw announced.
			d.Decisions, d.DecisionsProblem = h.decisions.list(), err.Error()
			return
		}
		d.Decisions = h.listedDecisions(listed)
	})
	if d.Query != "" {
		d.Searched = true
		if err := validText("The query", d.Query, 1024); err != nil {
			d.Search = panel{Service: "librarian", Down: err.Error()}
		} else if h.o.LibrarianAgentID == "" {
			d.Search = panel{Service: "librarian", Refused: "searching the knowledge graph needs CONCLAVE_CONSOLE_LIBRARIAN_AGENT_ID: the Librarian answers context queries for an agent"}
		} else {
			wg.Go(func() {
				nodes, err := h.o.Librarian.SearchGraph(r.Context(), s.Tokens.LibrarianAgent, h.o.LibrarianAgentID, d.Query, 20)
				d.Search, d.Nodes = panelOf("librarian", err), nodes
			})
		}
	}
	wg.Wait()
	h.render(w, r, http.StatusOK, "librarian", s, page{Title: "Librarian", Section: "librarian", Flash: flash(r), D: d})
}

func (h *Handler) decide(w http.ResponseWriter, r *http.Request, s session.Session) {
	id := r.PathValue("id")
	if !h.checkID(w, r, ids.LibrarianRequestID, id) {
		return
	}
	choice := r.PostForm.Get("decision")
	comment := strings.TrimSpace(r.PostForm.Get("comment"))
	if choice != "approve" && choice != "reject" {
		h.problem(w, r, http.StatusBadRequest, `The decision must be "approve" or "reject".`)
		return
	}
	if comment == "" || len(comment) > 4096 {
		h.problem(w, r, http.StatusBadRequest, "A comment of 1 to 4096 bytes is required.")
		return
	}
	st, traceID, err := h.o.Librarian.Decide(r.Context(), s.Tokens.Reviewer, id, choice, comment)
	if err != nil {
		h.backendProblem(w, r, err)
		return
	}
	h.recordOwnDecision(decision{RequestID: st.GetRequestId(), Outcome: st.GetStatus(), Source: "console", Comment: comment, TraceID: traceID, At: timeNow()})
	http.Redirect(w, r, "/librarian?done="+map[string]string{"approve": "approved", "reject": "rejected"}[choice], http.StatusSeeOther)
}

// flash turns ?done= into a fixed confirmation: the text never comes from
// the URL.
func flash(r *http.Request) string {
	return map[string]string{
		"launched":  "Launched: the instance is starting.",
		"prompted":  "Prompt sent.",
		"cancelled": "Cancellation sent.",
		"approved":  "Request approved.",
		"rejected":  "Request rejected.",
		"redriven":  "Dead letters put back on the retry queue.",
	}[r.URL.Query().Get("done")]
}

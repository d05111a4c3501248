package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/conclave-ai/conclave/functions/librarian/internal/events"
	"github.com/conclave-ai/conclave/functions/librarian/internal/governance"
	"github.com/conclave-ai/conclave/functions/librarian/internal/graph"
	"github.com/conclave-ai/conclave/functions/librarian/internal/policy"
	"github.com/conclave-ai/conclave/functions/librarian/internal/requests"
	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/store"
	eventsv1 "github.com/conclave-ai/conclave/proto/conclave/events/v1"
	librarianv1 "github.com/conclave-ai/conclave/proto/conclave/librarian/v1"
)

// DecodeRequest parses an AgentRequest body strictly (unknown fields are
// errors) and checks its shape against limits. Every failure is an
// *governance.InputError with a 4xx status.
func DecodeRequest(body []byte, limits policy.Limits) (*librarianv1.AgentRequest, error) {
	req := &librarianv1.AgentRequest{}
	if err := protojson.Unmarshal(body, req); err != nil {
		return nil, &governance.InputError{Status: http.StatusBadRequest, Code: "malformed_json",
			Message: "the body is not a valid AgentRequest: " + clip(strings.TrimPrefix(err.Error(), "proto: "))}
	}
	if err := governance.CheckShape(req, limits); err != nil {
		return nil, err
	}
	return req, nil
}

func (h *Handler) bodyLimit() int64 {
	return h.o.Policy.Protocol.Limits.MaxContentSize*2 + envelopeOverhead
}

func (h *Handler) submit(w http.ResponseWriter, r *http.Request) error {
	start := time.Now()
	body, err := readBody(r, h.bodyLimit())
	if err != nil {
		return err
	}
	req, err := DecodeRequest(body, h.o.Policy.Protocol.Limits)
	if err != nil {
		return err
	}
	agent, err := h.agentFor(r.Context(), req.GetAgentId())
	if err != nil {
		return err
	}
	if n := int64(len(body)); n > agent.MaxRequestSize {
		return &apiError{Status: http.StatusRequestEntityTooLarge, Code: "request_too_large",
			Message: fmt.Sprintf("the request is %d bytes; agent %s's max_request_size is %d", n, agent.ID, agent.MaxRequestSize)}
	}
	if req.AgentId == "" {
		req.AgentId = agent.ID
	}
	vctx, cancel := context.WithTimeout(r.Context(), h.o.Policy.Protocol.Timeouts.Validation)
	defer cancel()
	in := &governance.Input{Request: req, Agent: agent, Protocol: h.o.Policy.Protocol}
	d, err := h.o.Pipeline.Decide(vctx, in)
	validation := time.Since(start)
	if err != nil {
		return err
	}
	h.o.Observer.Decided(r.Context(), req.GetRequestType(), d.State.Status(), validation)
	if req.GetRequestType() == governance.TypeReport && d.State == governance.Approved {
		h.recordStats(r.Context(), d.State, validation)
		return h.report(w, r, req, start)
	}
	resp := h.response(r, d, start, submissionID(r, agent.ID, req))
	if req.GetRequestType() == governance.TypeQuery && d.State == governance.Approved {
		if err := h.answerQuery(r.Context(), req, resp); err != nil {
			return err
		}
	}
	rec := requests.Record{ID: resp.RequestId, AgentID: agent.ID, State: d.State, Request: req, Response: resp,
		Results: d.Results, Subject: d.Subject, Location: d.Location}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(r.Context(), carrier)
	rec.Traceparent, rec.Tracestate = carrier.Get("traceparent"), carrier.Get("tracestate")
	if d.State == governance.Escalated {
		rec.ReviewBy = h.o.Now().UTC().Add(h.o.Policy.Protocol.Timeouts.Escalation)
	}
	// The request is stored as submitted, then decided, in one write; the
	// events say both.
	for _, typ := range []string{events.Submitted, decisionEvent(d.State)} {
		if typ == "" {
			continue
		}
		if err := h.stage(r.Context(), &rec, typ); err != nil {
			return err
		}
	}
	// The decision is counted in the protocol's statistics with the write
	// that stores it: one commit, and a retried submission counts once.
	var counted []store.Op
	if h.o.Stats != nil {
		counted = h.o.Stats.Ops(d.State.Status(), validation)
	}
	created, err := h.o.Requests.Create(r.Context(), rec, counted...)
	if errors.Is(err, store.ErrConditionFailed) {
		return h.replay(w, r, rec.ID)
	} else if err != nil {
		return err
	}
	h.publishCreated(r.Context(), created)
	resp.ProcessingTimeMs = time.Since(start).Milliseconds()
	writeProto(w, http.StatusOK, resp)
	return nil
}

func (h *Handler) recordStats(ctx context.Context, s governance.State, validation time.Duration) {
	if h.o.Stats == nil {
		return
	}
	if err := h.o.Stats.Record(ctx, s.Status(), validation); err != nil {
		h.o.Logger.WarnContext(ctx, "protocol metrics not recorded", "error", err)
	}
}

// submissionID is the id of a new request: derived from its idempotency
// key when it has one (the Idempotency-Key header, else the request itself
// when the agent stamped it with the protocol's timestamp), random otherwise.
func submissionID(r *http.Request, agentID string, req *librarianv1.AgentRequest) string {
	if key := r.Header.Get("Idempotency-Key"); key != "" {
		return requests.RetryID(agentID, []byte("key:"+key))
	}
	if req.GetTimestamp() != nil {
		if b, err := (proto.MarshalOptions{Deterministic: true}).Marshal(req); err == nil {
			return requests.RetryID(agentID, append([]byte("request:"), b...))
		}
	}
	return requests.NewID()
}

// replay answers a retried submission with the request its first attempt
// stored (a lost answer, a killed Lambda): the same id and decision, its
// events sent if they were still staged, nothing decided or stored twice.
func (h *Handler) replay(w http.ResponseWriter, r *http.Request, id string) error {
	h.flush(r.Context(), id)
	rec, err := h.o.Requests.Get(r.Context(), id)
	if err != nil {
		return err
	}
	writeProto(w, http.StatusOK, rec.Response)
	return nil
}

func decisionEvent(s governance.State) string {
	switch s {
	case governance.Approved:
		return events.Approved
	case governance.Rejected, governance.ClarificationNeeded:
		return events.Rejected
	case governance.Escalated:
		return events.Escalated
	case governance.Completed:
		return events.Completed
	}
	return ""
}

// response turns a decision into the protocol's LibrarianResponse.
func (h *Handler) response(r *http.Request, d governance.Decision, start time.Time, id string) *librarianv1.LibrarianResponse {
	resp := &librarianv1.LibrarianResponse{
		RequestId: id, Timestamp: timestamppb.New(h.o.Now()), Status: d.State.Status(),
		Confidence: d.Confidence, Feedback: d.Feedback, Violations: d.Violations, Suggestions: d.Suggestions, Constraints: d.Constraints,
		ProcessingTimeMs: time.Since(start).Milliseconds(),
	}
	switch d.State {
	case governance.Approved:
		if d.Location != "" {
			resp.ApprovedLocation = proto.String(d.Location)
		}
		if d.Subject != "" {
			resp.AssignedId = proto.String(d.Subject)
		}
	case governance.Escalated:
		resp.EscalationReason = proto.String(d.EscalationReason)
		resp.HumanReviewUrl = proto.String(h.reviewURL(r, id))
		resp.EstimatedReviewTime = proto.Int32(int32(h.o.Policy.Protocol.Timeouts.Escalation / time.Minute))
	}
	return resp
}

func (h *Handler) reviewURL(r *http.Request, id string) string {
	base := h.o.BaseURL
	if base == "" {
		scheme := "https"
		if r.TLS == nil && (strings.HasPrefix(r.Host, "127.0.0.1") || strings.HasPrefix(r.Host, "localhost")) {
			scheme = "http"
		}
		base = scheme + "://" + r.Host
	}
	return strings.TrimSuffix(base, "/") + "/review/" + id
}

// answerQuery fills a QUERY's context and relevant_nodes.
func (h *Handler) answerQuery(ctx context.Context, req *librarianv1.AgentRequest, resp *librarianv1.LibrarianResponse) error {
	var types []string
	if req.GetTargetType() != "" {
		types = []string{req.GetTargetType()}
	}
	ranked, err := h.o.Graph.Search(ctx, req.GetContent(), types, 10)
	if err != nil {
		return err
	}
	resp.RelevantNodes, resp.Context = summarize(req.GetContent(), ranked)
	if len(ranked) == 0 {
		resp.Feedback = "No specification matches the query."
	} else {
		resp.Feedback = fmt.Sprintf("%d relevant nodes, best first.", len(ranked))
	}
	return nil
}

func summarize(query string, ranked []graph.Scored) ([]*librarianv1.NodeSummary, *structpb.Struct) {
	nodes := make([]*librarianv1.NodeSummary, 0, len(ranked))
	excerpts := map[string]any{}
	scores := map[string]any{}
	for _, s := range ranked {
		nodes = append(nodes, &librarianv1.NodeSummary{Id: s.Node.ID, Type: s.Node.Type, Title: s.Node.Title, Path: s.Node.Path})
		excerpts[s.Node.ID] = excerpt(s.Node.Text, 400)
		scores[s.Node.ID] = s.Score
	}
	ctx, _ := structpb.NewStruct(map[string]any{"query": query, "excerpts": excerpts, "scores": scores})
	return nodes, ctx
}

func excerpt(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) <= n {
		return s
	}
	for n > 0 && (s[n]&0xC0) == 0x80 {
		n--
	}
	return s[:n] + "…"
}

// stage adds an event about rec to its outbox, in the trace the request
// was submitted in (a reviewer's decision, made in a trace of its own,
// then reaches the waiting agent in the agent's).
func (h *Handler) stage(ctx context.Context, rec *requests.Record, typ string) error {
	if rec.Traceparent != "" {
		ctx = propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": rec.Traceparent, "tracestate": rec.Tracestate})
	}
	status := &librarianv1.RequestStatus{RequestId: rec.ID, Status: rec.State.Status(), UpdatedAt: timestamppb.New(h.o.Now()), Response: rec.Response}
	env, err := events.New(ctx, typ, map[string]string{"request_id": rec.ID, "agent_id": rec.AgentID}, status, h.o.Now())
	if err != nil {
		return err
	}
	b, err := queue.EncodeEnvelope(env)
	if err != nil {
		return err
	}
	rec.Outbox = append(rec.Outbox, b)
	return nil
}

// flush publishes a request's staged events and clears them. A failure
// leaves them staged, to be published by the next flush of the request
// (any later read or change of it); consumers deduplicate on the id.
func (h *Handler) flush(ctx context.Context, id string) {
	h.settle(ctx, id)
	rec, err := h.o.Requests.Get(ctx, id)
	if err != nil {
		return
	}
	h.publishStaged(ctx, rec)
}

// publishStaged is flush of a request the caller has just written: its
// outbox is known, and so is the version the clearing write starts from.
// It returns the request as it leaves it.
func (h *Handler) publishStaged(ctx context.Context, rec requests.Record) requests.Record {
	sent, ok := h.publishOutbox(ctx, rec)
	if !ok {
		return rec
	}
	cleared, err := h.clearOutbox(ctx, rec, sent)
	if err != nil {
		return rec
	}
	return cleared
}

// publishCreated is publishStaged of a request just created, whose answer
// need not wait for the outbox to be cleared: the events are sent before
// the answer, and the clearing write goes on after it (unless
// Options.AwaitOutboxClear). Until it lands, every read or change of the
// request in this process waits for it (settle) rather than send the
// events again; a crash before it lands leaves them staged, to be sent
// again by the next flush (at least once, as after a failed send).
func (h *Handler) publishCreated(ctx context.Context, rec requests.Record) {
	if h.o.AwaitOutboxClear {
		h.publishStaged(ctx, rec)
		return
	}
	sent, ok := h.publishOutbox(ctx, rec)
	if !ok {
		return
	}
	// The caller goes on to change its response (the processing time)
	// while the clear writes the record.
	rec.Response = proto.CloneOf(rec.Response)
	done := make(chan struct{})
	h.clearing.Store(rec.ID, done)
	go func() {
		defer func() {
			h.clearing.CompareAndDelete(rec.ID, done)
			close(done)
		}()
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.o.Policy.Protocol.Timeouts.Response)
		defer cancel()
		_, _ = h.clearOutbox(cctx, rec, sent)
	}()
}

// settle waits for the clear of request id's outbox still in flight in
// this process, if any, so that what is read next is not a record whose
// events were sent and are being cleared.
func (h *Handler) settle(ctx context.Context, id string) {
	if v, ok := h.clearing.Load(id); ok {
		select {
		case <-v.(chan struct{}):
		case <-ctx.Done():
		}
	}
}

// publishOutbox sends rec's staged events and returns what it sent (the
// encoded envelopes), and whether there is anything to clear.
func (h *Handler) publishOutbox(ctx context.Context, rec requests.Record) (map[string]bool, bool) {
	if len(rec.Outbox) == 0 {
		return nil, false
	}
	id := rec.ID
	envs := make([]*eventsv1.Envelope, 0, len(rec.Outbox))
	sent := make(map[string]bool, len(rec.Outbox))
	for _, b := range rec.Outbox {
		sent[string(b)] = true
		env := &eventsv1.Envelope{}
		if err := protojson.Unmarshal(b, env); err != nil {
			h.o.Logger.ErrorContext(ctx, "a staged event is corrupt; dropped", "request_id", id, "error", err)
			continue
		}
		envs = append(envs, env)
	}
	err := h.publish(ctx, envs)
	h.o.Observer.Published(ctx, len(envs), err)
	if err != nil {
		h.o.Logger.WarnContext(ctx, "events not published yet; they stay staged", "request_id", id, "events", len(envs), "error", err)
		return nil, false
	}
	return sent, true
}

// clearOutbox removes the sent events from the request's outbox: exactly
// those (envelope ids are random, so the encoded envelope names one), since
// a concurrent change may have staged more, or cleared them already.
func (h *Handler) clearOutbox(ctx context.Context, rec requests.Record, sent map[string]bool) (requests.Record, error) {
	cleared, err := h.o.Requests.UpdateFrom(ctx, rec, func(r *requests.Record) error {
		// A new slice: r's shares its array with the caller's record.
		var kept []json.RawMessage
		for _, b := range r.Outbox {
			if !sent[string(b)] {
				kept = append(kept, b)
			}
		}
		r.Outbox = kept
		return nil
	})
	if err != nil {
		h.o.Logger.WarnContext(ctx, "published events stay staged and will be sent again", "request_id", rec.ID, "error", err)
	}
	return cleared, err
}

// publish sends envelopes, retrying a failed send max_retry_attempts times
// with a doubling pause, within the request's deadline.
func (h *Handler) publish(ctx context.Context, envs []*eventsv1.Envelope) error {
	pause := 25 * time.Millisecond
	var err error
	for attempt := 0; ; attempt++ {
		if err = h.o.Events.Publish(ctx, envs...); err == nil || attempt >= h.o.Policy.Protocol.Limits.MaxRetryAttempts {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(pause):
		}
		pause *= 2
	}
}

// report completes an approved request: REPORT with completed=true moves
// it to COMPLETED, records changes_made and applies the change to the
// knowledge graph; completed=false records the report only.
func (h *Handler) report(w http.ResponseWriter, r *http.Request, req *librarianv1.AgentRequest, start time.Time) error {
	rep := requests.Report{Completed: req.GetCompleted(), ChangesMade: req.GetChangesMade(), Content: req.GetContent(), At: h.o.Now().UTC()}
	retried := false
	h.settle(r.Context(), req.GetRequestId())
	rec, err := h.o.Requests.Update(r.Context(), req.GetRequestId(), func(rec *requests.Record) error {
		retried = false // a retried update starts over
		if rep.Completed && rec.State == governance.Completed && len(rec.Reports) > 0 && sameReport(rec.Reports[len(rec.Reports)-1], rep) {
			// The REPORT that completed the request, sent again: its
			// answer may have been lost after the state was written and
			// before the graph was. Nothing to write; the change is
			// applied again below, idempotently.
			retried = true
			return errRetriedReport
		}
		if rec.Request.GetRequestType() != governance.TypeApproval || rec.Request.GetAction() == governance.ActionRead {
			return &apiError{Status: http.StatusConflict, Code: "not_a_change", Field: "request_id",
				Message: fmt.Sprintf("request %s is a %s, not an APPROVAL of a change; only those are reported", rec.ID, rec.Request.GetRequestType())}
		}
		if !rep.Completed {
			if rec.State != governance.Approved {
				return &apiError{Status: http.StatusConflict, Code: "illegal_transition", Message: fmt.Sprintf("request %s is %s, not approved", rec.ID, rec.State.Status())}
			}
			rec.Reports = append(rec.Reports, rep)
			return nil
		}
		if err := governance.Transition(rec.State, governance.Completed); err != nil {
			return &apiError{Status: http.StatusConflict, Code: "illegal_transition", Message: err.Error()}
		}
		rec.State = governance.Completed
		rec.Reports = append(rec.Reports, rep)
		rec.Response.Status = governance.Completed.Status()
		if err := h.stage(r.Context(), rec, events.Completed); err != nil {
			return err
		}
		if t := rec.Request.GetTargetType(); t == "architecture" || t == "design" {
			return h.stage(r.Context(), rec, events.SpecificationChanged)
		}
		return nil
	})
	if errors.Is(err, errRetriedReport) {
		err = nil
	}
	if err != nil {
		return err
	}
	if rep.Completed {
		if err := h.applyChange(r.Context(), rec); err != nil {
			return err
		}
	}
	h.publishStaged(r.Context(), rec)
	feedback := fmt.Sprintf("Recorded a progress report on %s.", rec.ID)
	switch {
	case retried:
		feedback = fmt.Sprintf("Request %s was already completed by this report; the knowledge graph is up to date.", rec.ID)
	case rep.Completed:
		feedback = fmt.Sprintf("Request %s is completed; the knowledge graph is updated.", rec.ID)
	}
	writeProto(w, http.StatusOK, &librarianv1.LibrarianResponse{RequestId: rec.ID, Timestamp: timestamppb.New(h.o.Now()),
		Status: "approved", Confidence: 1, Feedback: feedback, ProcessingTimeMs: time.Since(start).Milliseconds()})
	return nil
}

// errRetriedReport stops the update of a REPORT sent again.
var errRetriedReport = errors.New("the request was completed by this report already")

// sameReport reports whether two completing REPORTs say the same.
func sameReport(a, b requests.Report) bool {
	return a.Completed == b.Completed && a.Content == b.Content && slices.Equal(a.ChangesMade, b.ChangesMade)
}

// applyChange writes a completed change to the knowledge graph. It is
// idempotent, so a retried REPORT that failed here can apply it again.
func (h *Handler) applyChange(ctx context.Context, rec requests.Record) error {
	req := rec.Request
	if rec.Subject == "" {
		return nil
	}
	if req.GetAction() == governance.ActionDelete {
		return h.o.Graph.Delete(ctx, rec.Subject)
	}
	path := rec.Location
	if path == "" {
		if cur, err := h.o.Graph.Get(ctx, rec.Subject); err == nil {
			path = cur.Path
		}
	}
	title := governance.Title(req.GetContent())
	if title == "" {
		title = path
	}
	return h.o.Graph.Put(ctx, graph.Node{ID: rec.Subject, Type: req.GetTargetType(), Path: path, Title: title,
		ContentHash: graph.HashContent(req.GetContent()), References: req.GetReferences(), DependsOn: req.GetDependsOn(), Text: req.GetContent()})
}

func (h *Handler) status(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("request_id")
	if err := CheckRequestID(id); err != nil {
		return err
	}
	h.settle(r.Context(), id)
	rec, err := h.o.Requests.Get(r.Context(), id)
	if errors.Is(err, requests.ErrNotFound) {
		return &apiError{Status: http.StatusNotFound, Code: "request_not_found", Message: fmt.Sprintf("request %q does not exist", clip(id))}
	}
	if err != nil {
		return err
	}
	if p := principal(r.Context()); p.Role == "agent" && p.Subject != rec.AgentID {
		return &apiError{Status: http.StatusForbidden, Code: "not_your_request", Message: fmt.Sprintf("request %s belongs to another agent", id)}
	}
	if rec, err = h.expireOverdue(r.Context(), rec); err != nil {
		return err
	}
	rec = h.publishStaged(r.Context(), rec)
	writeProto(w, http.StatusOK, statusOf(rec))
	return nil
}

func statusOf(rec requests.Record) *librarianv1.RequestStatus {
	return &librarianv1.RequestStatus{RequestId: rec.ID, Status: rec.State.Status(), UpdatedAt: timestamppb.New(rec.UpdatedAt), Response: rec.Response}
}

// contextQuery is ContextQuery with its limits.
const (
	defaultContextLimit = 10
	maxContextLimit     = 50
	maxQueryBytes       = 4 << 10
)

func (h *Handler) context(w http.ResponseWriter, r *http.Request) error {
	body, err := readBody(r, maxQueryBytes*2+4<<10)
	if err != nil {
		return err
	}
	q := &librarianv1.ContextQuery{}
	if err := protojson.Unmarshal(body, q); err != nil {
		return &apiError{Status: http.StatusBadRequest, Code: "malformed_json", Message: "the body is not a valid ContextQuery: " + clip(err.Error())}
	}
	switch {
	case strings.TrimSpace(q.GetQuery()) == "":
		return &apiError{Status: http.StatusBadRequest, Code: "missing_query", Field: "query", Message: "query is required"}
	case len(q.GetQuery()) > maxQueryBytes:
		return &apiError{Status: http.StatusRequestEntityTooLarge, Code: "query_too_large", Field: "query", Message: fmt.Sprintf("query may have %d bytes", maxQueryBytes)}
	case q.GetLimit() < 0 || q.GetLimit() > maxContextLimit:
		return &apiError{Status: http.StatusBadRequest, Code: "invalid_limit", Field: "limit", Message: fmt.Sprintf("limit must be 0..%d", maxContextLimit)}
	}
	for _, t := range q.GetTargetTypes() {
		if !contains(policy.TargetTypes, t) {
			return &apiError{Status: http.StatusBadRequest, Code: "unknown_target_type", Field: "target_types", Message: fmt.Sprintf("%q is not one of %s", clip(t), strings.Join(policy.TargetTypes, ", "))}
		}
	}
	agent, err := h.agentFor(r.Context(), q.GetAgentId())
	if err != nil {
		return err
	}
	if !agent.Can("read") {
		return &apiError{Status: http.StatusForbidden, Code: "capability_missing", Message: fmt.Sprintf("agent %q lacks the read capability", agent.ID)}
	}
	// Context queries spend the same budget as requests: they cost more.
	if err := h.take(r.Context(), agent); err != nil {
		return err
	}
	limit := int(q.GetLimit())
	if limit == 0 {
		limit = defaultContextLimit
	}
	ranked, err := h.o.Graph.Search(r.Context(), q.GetQuery(), q.GetTargetTypes(), limit)
	if err != nil {
		return err
	}
	nodes, ctx := summarize(q.GetQuery(), ranked)
	writeProto(w, http.StatusOK, &librarianv1.ContextResponse{Nodes: nodes, Context: ctx})
	return nil
}

func (h *Handler) take(ctx context.Context, agent policy.Agent) error {
	out, err := (governance.RateLimits{Limiter: h.o.Limiter}).Check(ctx, &governance.Input{Agent: agent})
	if err != nil {
		return err
	}
	if out.Denial != nil {
		return out.Denial
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func (h *Handler) capabilities(w http.ResponseWriter, r *http.Request) error {
	agent, err := h.agentFor(r.Context(), r.URL.Query().Get("agent_id"))
	if err != nil {
		return err
	}
	writeProto(w, http.StatusOK, &librarianv1.AgentCapabilities{AgentId: agent.ID, AgentType: agent.Type, Capabilities: agent.Capabilities,
		RateLimit: agent.RateLimit.String(), MaxRequestSizeBytes: agent.MaxRequestSize, AllowedTargets: agent.AllowedTargets})
	return nil
}

func (h *Handler) metrics(w http.ResponseWriter, r *http.Request) error {
	if h.o.Stats == nil {
		return &apiError{Status: http.StatusNotFound, Code: "not_found", Message: "protocol metrics are not kept here"}
	}
	snap, err := h.o.Stats.Snapshot(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, snap)
	return nil
}

// jsonBody is a small JSON body decoded into v, strictly.
func jsonBody(r *http.Request, limit int64, v any) error {
	body, err := readBody(r, limit)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return &apiError{Status: http.StatusBadRequest, Code: "malformed_json", Message: "the body is not valid: " + clip(err.Error())}
	}
	return nil
}

// Package a2a serves every agent on the gateway as an Agent2Agent (A2A)
// agent: an agent card per agent, and A2A's JSON-RPC binding (1.0, and
// the method names of 0.3) over the client API.
//
// A task is one request of the client API: its id is the request_id, its
// contextId the thread_id, and what it said is the thread's history. Its
// record in the store (TasksTable) names it and keeps its last known
// state, updated with version-checked writes by whichever replica sees it
// end. Every call runs in this process through the client API's own
// interceptors (bearer tokens, per-client rates and streams), and from
// there reaches other replicas as the client API does: a message to an
// agent held elsewhere is forwarded, a cancel goes to the replica that
// assigned the request, a subscription follows the request at the
// replica answering it.
package a2a

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2acompat/a2av0"
	"github.com/a2aproject/a2a-go/v2/a2asrv"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/conclave-ai/conclave/pkg/auth"
	"github.com/conclave-ai/conclave/pkg/ids"
	"github.com/conclave-ai/conclave/pkg/store"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
	"github.com/conclave-ai/conclave/services/gateway/internal/clientapi"
	"github.com/conclave-ai/conclave/services/gateway/internal/history"
	"github.com/conclave-ai/conclave/services/gateway/internal/metrics"
)

// Options configure a Server.
type Options struct {
	// PublicURL is the gateway's URL as A2A clients reach it (scheme,
	// host and port, no path); empty: the request's Host, over http (or
	// https for a TLS connection).
	PublicURL string
	// Secured says that the client API requires a bearer token, which the
	// cards then declare.
	Secured bool
	// Admins are the clients (auth.ClientID) that may read every task.
	Admins []string
	// History is the thread history, nil when the gateway keeps none:
	// tasks then have no artifacts to read back, and SubscribeToTask is
	// not supported.
	History *history.Store
	// TaskTTL is how long a task's record is kept after its last change:
	// the history's retention. 0 keeps it until deleted.
	TaskTTL time.Duration
	// CancelWait bounds how long CancelTask waits for the agent to end
	// the task; 0 means 10s.
	CancelWait time.Duration
	Logger     *slog.Logger
	Metrics    *metrics.Metrics
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// Server is the A2A face of the client API.
type Server struct {
	api    gatewayv1.GatewayServiceServer
	unary  grpc.UnaryServerInterceptor
	stream grpc.StreamServerInterceptor
	tasks  *tasks
	hist   *history.Store
	opts   Options
	admins map[string]bool
	log    *slog.Logger
	m      *metrics.Metrics
	now    func() time.Time

	v1, v0 http.Handler
}

// New serves api as A2A, every call through ic as on gRPC, with task
// records in st (whose TasksTable must exist).
func New(api gatewayv1.GatewayServiceServer, ic clientapi.Interceptors, st store.Store, opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Metrics == nil {
		opts.Metrics = metrics.Discard()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.CancelWait <= 0 {
		opts.CancelWait = 10 * time.Second
	}
	s := &Server{api: api, tasks: &tasks{st: st, ttl: opts.TaskTTL, now: opts.Now}, hist: opts.History, opts: opts,
		admins: map[string]bool{}, log: opts.Logger, m: opts.Metrics, now: opts.Now}
	s.unary, s.stream = ic.Chain()
	for _, a := range opts.Admins {
		s.admins[a] = true
	}
	h := &handler{s: s}
	// A panic is answered as an internal error and logged; pkg/server's
	// recovery would answer it outside JSON-RPC.
	recovered := a2asrv.WithTransportPanicHandler(func(r any) error {
		s.log.Error("A2A call panicked", "panic", fmt.Sprint(r))
		return a2a.NewError(a2a.ErrInternalError, "internal error")
	})
	s.v1 = a2asrv.NewJSONRPCHandler(h, recovered)
	s.v0 = a2av0.NewJSONRPCHandler(h, recovered)
	return s
}

// Routes registers the A2A routes: the cards as unary routes, the
// JSON-RPC endpoint as a streaming one (its streams, and a blocking
// SendMessage, last as long as the agent works).
func (s *Server) Routes(unary, stream func(pattern string, h http.Handler)) {
	unary("GET /a2a/agents", http.HandlerFunc(s.serveList))
	unary("GET /a2a/{agent_id}/.well-known/agent-card.json", http.HandlerFunc(s.serveCard))
	stream("POST /a2a/{agent_id}", http.HandlerFunc(s.serveRPC))
}

type agentKey struct{}

func agentFrom(ctx context.Context) string {
	id, _ := ctx.Value(agentKey{}).(string)
	return id
}

// rpcHead is what the endpoint reads of a JSON-RPC request before the
// A2A handler reads all of it.
type rpcHead struct {
	Method string `json:"method"`
	ID     any    `json:"id"`
}

// The A2A methods, as the interceptors and the metrics name them.
var (
	streamMethods = map[string]string{
		"SendMessage": "SendMessage", "message/send": "SendMessage",
		"SendStreamingMessage": "SendStreamingMessage", "message/stream": "SendStreamingMessage",
		"SubscribeToTask": "SubscribeToTask", "tasks/resubscribe": "SubscribeToTask",
	}
	unaryMethods = map[string]string{
		"GetTask": "GetTask", "tasks/get": "GetTask",
		"CancelTask": "CancelTask", "tasks/cancel": "CancelTask",
	}
)

// MethodPrefix starts the full method name the interceptors see for an
// A2A call: the client API's, so that they guard it as one of its own.
var MethodPrefix = clientapi.ServicePrefix + "A2A."

// serveRPC is the JSON-RPC endpoint of one agent. It reads the body (the
// server bounds its size), authenticates the caller and takes its rate and
// stream limits as the client API does, then hands the request to the 1.0
// or the 0.3 handler by its method's name (0.3's have a '/').
func (s *Server) serveRPC(w http.ResponseWriter, r *http.Request) {
	agentID := r.PathValue("agent_id")
	body, err := io.ReadAll(r.Body)
	if err != nil {
		if e, ok := errors.AsType[*http.MaxBytesError](err); ok {
			writeRPCError(w, http.StatusRequestEntityTooLarge, nil, a2a.NewError(a2a.ErrInvalidRequest, fmt.Sprintf("request body exceeds %d bytes", e.Limit)))
			return
		}
		writeRPCError(w, http.StatusBadRequest, nil, a2a.NewError(a2a.ErrInvalidRequest, "the request body could not be read"))
		return
	}
	var head rpcHead
	_ = json.Unmarshal(body, &head) // the handler answers a malformed body
	switch head.ID.(type) {
	case string, float64:
	default:
		head.ID = nil // not an id JSON-RPC allows: the handler refuses it
	}
	if err := ids.AgentID.Check(agentID); err != nil {
		writeRPCError(w, http.StatusBadRequest, head.ID, invalidParams(err.Error()))
		return
	}
	name, streaming := streamMethods[head.Method]
	if !streaming {
		if name = unaryMethods[head.Method]; name == "" {
			name = "other"
		}
	}
	started := s.now()
	ctx := context.WithValue(clientapi.Incoming(r), agentKey{}, agentID)
	serve := func(ctx context.Context) {
		r := r.WithContext(ctx)
		r.Body = io.NopCloser(bytes.NewReader(body))
		if strings.Contains(head.Method, "/") {
			s.v0.ServeHTTP(w, r)
		} else {
			s.v1.ServeHTTP(w, r)
		}
	}
	method := MethodPrefix + name
	if streaming {
		err = s.stream(s.api, newCtxStream(ctx), &grpc.StreamServerInfo{FullMethod: method, IsServerStream: true}, func(_ any, ss grpc.ServerStream) error {
			serve(ss.Context())
			return nil
		})
	} else {
		_, err = s.unary(ctx, nil, &grpc.UnaryServerInfo{Server: s.api, FullMethod: method}, func(ctx context.Context, _ any) (any, error) {
			// Unary calls are bounded as the server's unary routes are.
			ctx, cancel := context.WithTimeout(ctx, unaryTimeout)
			defer cancel()
			serve(ctx)
			return nil, nil
		})
	}
	if err != nil {
		s.m.A2ACall(name, "refused")
		s.refuse(w, head.ID, err)
		return
	}
	s.m.A2ACall(name, "served")
	s.log.DebugContext(r.Context(), "A2A call", "method", name, "agent_id", agentID, "took", s.now().Sub(started))
}

// unaryTimeout bounds GetTask and CancelTask (which waits CancelWait at
// most for the agent).
const unaryTimeout = 30 * time.Second

// refuse answers a call the interceptors refused: 401 for a missing or
// wrong token (with WWW-Authenticate, as A2A's HTTP bindings ask), 429
// with Retry-After past a limit, in JSON-RPC's error form.
func (s *Server) refuse(w http.ResponseWriter, id any, err error) {
	st := status.Convert(err)
	switch st.Code() {
	case codes.Unauthenticated:
		w.Header().Set("WWW-Authenticate", `Bearer realm="conclave-gateway"`)
		writeRPCError(w, http.StatusUnauthorized, id, a2a.NewError(a2a.ErrUnauthenticated, st.Message()))
	case codes.ResourceExhausted:
		if wait := retryDelay(st); wait > 0 {
			w.Header().Set("Retry-After", auth.RetryAfter(wait))
		}
		writeRPCError(w, http.StatusTooManyRequests, id, a2a.NewError(a2a.ErrServerError, st.Message()))
	default:
		writeRPCError(w, http.StatusServiceUnavailable, id, a2a.NewError(a2a.ErrServerError, st.Message()))
	}
}

// rpcError is a JSON-RPC error object as A2A writes it.
type rpcError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Data    []any  `json:"data,omitempty"`
}

// rpcCodes are A2A's JSON-RPC error codes.
var rpcCodes = []struct {
	err  error
	code int
}{
	{a2a.ErrParseError, -32700}, {a2a.ErrInvalidRequest, -32600}, {a2a.ErrMethodNotFound, -32601},
	{a2a.ErrInvalidParams, -32602}, {a2a.ErrInternalError, -32603}, {a2a.ErrServerError, -32000},
	{a2a.ErrTaskNotFound, -32001}, {a2a.ErrUnauthenticated, -31401}, {a2a.ErrUnauthorized, -31403},
}

// writeRPCError writes a JSON-RPC error response for the errors answered
// before the A2A handler runs, with A2A's ErrorInfo detail.
func writeRPCError(w http.ResponseWriter, httpStatus int, id any, err error) {
	code := -32603
	for _, c := range rpcCodes {
		if errors.Is(err, c.err) {
			code = c.code
			break
		}
	}
	info := map[string]any{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": a2a.ErrorReason(err), "domain": a2a.ProtocolDomain}
	body, _ := json.Marshal(struct {
		JSONRPC string   `json:"jsonrpc"`
		ID      any      `json:"id"`
		Error   rpcError `json:"error"`
	}{"2.0", id, rpcError{Code: code, Message: err.Error(), Data: []any{info}}})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(httpStatus)
	_, _ = w.Write(append(body, '\n'))
}

// writeHTTPError writes an error of the card routes in A2A's HTTP error
// form: a google.rpc.Status under "error", with A2A's ErrorInfo.
func writeHTTPError(w http.ResponseWriter, httpStatus int, grpcStatus, reason, message string) {
	body, _ := json.Marshal(map[string]any{"error": map[string]any{
		"code": httpStatus, "status": grpcStatus, "message": message,
		"details": []any{map[string]any{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason, "domain": a2a.ProtocolDomain}},
	}})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(httpStatus)
	_, _ = w.Write(append(body, '\n'))
}

// writeStatusHTTP answers a client API error on a card route.
func writeStatusHTTP(w http.ResponseWriter, err error) {
	st := status.Convert(err)
	switch st.Code() {
	case codes.Unauthenticated:
		w.Header().Set("WWW-Authenticate", `Bearer realm="conclave-gateway"`)
		writeHTTPError(w, http.StatusUnauthorized, "UNAUTHENTICATED", "UNAUTHENTICATED", st.Message())
	case codes.InvalidArgument:
		writeHTTPError(w, http.StatusBadRequest, "INVALID_ARGUMENT", "INVALID_REQUEST", st.Message())
	case codes.NotFound:
		writeHTTPError(w, http.StatusNotFound, "NOT_FOUND", "AGENT_NOT_FOUND", st.Message())
	case codes.ResourceExhausted:
		if wait := retryDelay(st); wait > 0 {
			w.Header().Set("Retry-After", auth.RetryAfter(wait))
		}
		writeHTTPError(w, http.StatusTooManyRequests, "RESOURCE_EXHAUSTED", "RESOURCE_EXHAUSTED", st.Message())
	default:
		writeHTTPError(w, http.StatusServiceUnavailable, "UNAVAILABLE", "UNAVAILABLE", st.Message())
	}
}

// baseURL is the gateway's URL as the caller reached it, unless the
// operator set the public one.
func (s *Server) baseURL(r *http.Request) string {
	if s.opts.PublicURL != "" {
		return strings.TrimRight(s.opts.PublicURL, "/")
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

// card is agent a's A2A card: its skills are its capabilities; it streams;
// its one interface is this gateway's JSON-RPC endpoint for it, in both
// protocol versions; it declares the bearer token when one is required.
func (s *Server) card(base string, a *gatewayv1.Agent) *a2a.AgentCard {
	endpoint := base + "/a2a/" + url.PathEscape(a.GetAgentId())
	name := a.GetName()
	if name == "" {
		name = a.GetAgentId()
	}
	c := &a2a.AgentCard{
		Name:        name,
		Description: fmt.Sprintf("The coven agent %q, served by the Conclave gateway.", a.GetAgentId()),
		Version:     "1",
		SupportedInterfaces: []*a2a.AgentInterface{
			{URL: endpoint, ProtocolBinding: a2a.TransportProtocolJSONRPC, ProtocolVersion: a2a.Version},
			{URL: endpoint, ProtocolBinding: a2a.TransportProtocolJSONRPC, ProtocolVersion: a2av0.Version},
		},
		Capabilities:       a2a.AgentCapabilities{Streaming: true},
		DefaultInputModes:  []string{"text/plain", "application/octet-stream", "application/json"},
		DefaultOutputModes: []string{"text/plain", "application/octet-stream", "application/json"},
		Skills:             []a2a.AgentSkill{},
	}
	for _, cap := range a.GetCapabilities() {
		c.Skills = append(c.Skills, a2a.AgentSkill{ID: cap, Name: cap, Description: fmt.Sprintf("The agent's %q capability.", cap), Tags: []string{cap}})
	}
	if len(c.Skills) == 0 {
		c.Skills = append(c.Skills, a2a.AgentSkill{ID: "message", Name: "message", Description: "Answers a message.", Tags: []string{"message"}})
	}
	if s.opts.Secured {
		c.SecuritySchemes = a2a.NamedSecuritySchemes{"bearer": a2a.HTTPAuthSecurityScheme{
			Scheme: "Bearer", Description: "A client token of the gateway (CONCLAVE_GATEWAY_CLIENT_TOKENS).",
		}}
		c.SecurityRequirements = a2a.SecurityRequirementsOptions{{"bearer": {}}}
	}
	return c
}

// cardJSON is a card as JSON that both 1.0 and 0.3 clients read: a2av0's
// union of the two forms, whose security schemes are in 0.3's form only
// ({"type": "http", ...}), which 1.0's parser refuses; each is given its
// 1.0 form too ({"httpAuthSecurityScheme": {...}}), which 0.3's ignores.
func cardJSON(ctx context.Context, c *a2a.AgentCard) (json.RawMessage, error) {
	p, ok := a2av0.NewStaticAgentCardProducer(c).(a2asrv.AgentCardJSONProducer)
	if !ok {
		return json.Marshal(c)
	}
	data, err := p.CardJSON(ctx)
	if err != nil {
		return nil, err
	}
	var card map[string]json.RawMessage
	if err := json.Unmarshal(data, &card); err != nil {
		return nil, err
	}
	if len(c.SecuritySchemes) > 0 {
		var compat map[a2a.SecuritySchemeName]map[string]any
		if err := json.Unmarshal(card["securitySchemes"], &compat); err != nil {
			return nil, err
		}
		current, err := json.Marshal(c.SecuritySchemes)
		if err != nil {
			return nil, err
		}
		var v1 map[a2a.SecuritySchemeName]map[string]any
		if err := json.Unmarshal(current, &v1); err != nil {
			return nil, err
		}
		for name, forms := range v1 {
			for k, v := range forms {
				if compat[name] != nil {
					compat[name][k] = v
				}
			}
		}
		if card["securitySchemes"], err = json.Marshal(compat); err != nil {
			return nil, err
		}
	}
	return json.Marshal(card)
}

// call runs fn as a unary client API call named method, through the
// interceptors.
func (s *Server) call(r *http.Request, method string, fn func(ctx context.Context) (any, error)) (any, error) {
	return s.unary(clientapi.Incoming(r), nil, &grpc.UnaryServerInfo{Server: s.api, FullMethod: MethodPrefix + method}, func(ctx context.Context, _ any) (any, error) {
		return fn(ctx)
	})
}

// serveCard answers one agent's card; an agent connected to no replica is
// a 404.
func (s *Server) serveCard(w http.ResponseWriter, r *http.Request) {
	out, err := s.call(r, "AgentCard", func(ctx context.Context) (any, error) {
		return s.api.GetAgent(ctx, &gatewayv1.GetAgentRequest{AgentId: r.PathValue("agent_id")})
	})
	if err != nil {
		s.m.A2ACall("AgentCard", "refused")
		writeStatusHTTP(w, err)
		return
	}
	s.m.A2ACall("AgentCard", "served")
	data, err := cardJSON(r.Context(), s.card(s.baseURL(r), out.(*gatewayv1.GetAgentResponse).GetAgent()))
	if err != nil {
		s.log.ErrorContext(r.Context(), "could not encode an agent card", "error", err)
		writeHTTPError(w, http.StatusInternalServerError, "INTERNAL", "INTERNAL_ERROR", "internal error")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(data, '\n'))
}

// serveList answers one page of the connected agents' cards:
// {"agents": [card], "next_page_token": ""}, paged as GET /v1/agents.
func (s *Server) serveList(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var size int32
	if v := q.Get("page_size"); v != "" {
		if _, err := fmt.Sscan(v, &size); err != nil || size < 0 {
			writeHTTPError(w, http.StatusBadRequest, "INVALID_ARGUMENT", "INVALID_REQUEST", "page_size must be a non-negative number")
			return
		}
	}
	out, err := s.call(r, "ListAgentCards", func(ctx context.Context) (any, error) {
		return s.api.ListAgents(ctx, &gatewayv1.ListAgentsRequest{PageSize: size, PageToken: q.Get("page_token"), Capability: q.Get("capability")})
	})
	if err != nil {
		s.m.A2ACall("ListAgentCards", "refused")
		writeStatusHTTP(w, err)
		return
	}
	s.m.A2ACall("ListAgentCards", "served")
	list := out.(*gatewayv1.ListAgentsResponse)
	resp := struct {
		Agents        []json.RawMessage `json:"agents"`
		NextPageToken string            `json:"next_page_token"`
	}{Agents: []json.RawMessage{}, NextPageToken: list.GetNextPageToken()}
	base := s.baseURL(r)
	for _, a := range list.GetAgents() {
		data, err := cardJSON(r.Context(), s.card(base, a))
		if err != nil {
			s.log.ErrorContext(r.Context(), "could not encode an agent card", "error", err)
			writeHTTPError(w, http.StatusInternalServerError, "INTERNAL", "INTERNAL_ERROR", "internal error")
			return
		}
		resp.Agents = append(resp.Agents, data)
	}
	body, _ := json.Marshal(resp)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(body, '\n'))
}

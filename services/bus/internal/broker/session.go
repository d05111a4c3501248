package broker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/time/rate"

	"github.com/conclave-ai/conclave/pkg/auth"
	"github.com/conclave-ai/conclave/pkg/jsonrpc"
	"github.com/conclave-ai/conclave/pkg/jsonscan"
	"github.com/conclave-ai/conclave/services/bus/internal/topic"
)

// MaxClientIDLen bounds a clientId.
const MaxClientIDLen = 128

// Session is one client connection: the JSON-RPC handler of its requests,
// and the subscriber the broker delivers to.
type Session struct {
	b       *Broker
	limiter *rate.Limiter
	// grant is what the token presented at the WebSocket upgrade allows;
	// nil when none was presented, and tokens are then expected in
	// initialize (unless open is set).
	grant *Grant
	// access resolves a token sent in initialize; nil with open.
	access *Access
	open   bool
	// throttle counts the wrong tokens sent in initialize against the
	// connection's remote address.
	throttle *auth.Throttle
	remote   string

	mu           sync.Mutex
	conn         *jsonrpc.Conn
	initialized  bool
	clientID     string
	agent        bool
	defaultTopic string
	// launchTopic is the topic the default handler launched this client
	// (an agent) for.
	launchTopic string
	perms       *permissions
	subs        []*subscription
}

// SessionAuth is how a new session is authenticated.
type SessionAuth struct {
	// Open: no token is required (conclave dev); every client gets OpenGrant.
	Open bool
	// Grant is the grant of the token presented at the upgrade, if any.
	Grant *Grant
	// Access resolves a token sent in initialize instead.
	Access *Access
	// Throttle (nil: none) counts wrong tokens sent in initialize against
	// Remote, the connection's remote address, as the upgrade's are.
	Throttle *auth.Throttle
	Remote   string
}

// NewSession returns the handler of a new connection. Bind it to its
// jsonrpc.Conn with Attach.
func (b *Broker) NewSession(auth SessionAuth) *Session {
	b.opts.Metrics.connected(1)
	return &Session{
		b:        b,
		limiter:  rate.NewLimiter(rate.Limit(b.opts.Rate), b.opts.Burst),
		grant:    auth.Grant,
		access:   auth.Access,
		open:     auth.Open,
		throttle: auth.Throttle,
		remote:   auth.Remote,
	}
}

// Attach binds the session to its connection.
func (s *Session) Attach(c *jsonrpc.Conn) {
	s.mu.Lock()
	s.conn = c
	s.mu.Unlock()
}

// Close removes the session's subscriptions; the connection's owner calls
// it once the connection has ended (no goroutine per idle connection waits
// for that here).
func (s *Session) Close() {
	s.mu.Lock()
	s.subs = nil
	s.mu.Unlock()
	s.b.removeSubscriptions(func(sub *subscription) bool { return sub.session == s })
	s.b.opts.Metrics.connected(-1)
}

// ClientID is the id the client initialized with.
func (s *Session) ClientID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.clientID
}

func (s *Session) isAgent() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.agent
}

func (s *Session) mayReceive(t string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.perms != nil && s.perms.mayReceive(t)
}

// start sends a request to the client; the answer goes to onDone, or when
// that is nil is awaited on the returned call. Deferred (with onDone), the
// request is only queued, for flush.
func (s *Session) start(ctx context.Context, method string, params *jsonrpc.Params, deferred bool, onDone func(json.RawMessage, error)) (*jsonrpc.PendingCall, error) {
	s.mu.Lock()
	c := s.conn
	s.mu.Unlock()
	switch {
	case c == nil:
		return nil, jsonrpc.ErrClosed
	case onDone == nil:
		return c.Start(ctx, method, params)
	case deferred:
		return c.GoDeferred(ctx, method, params, onDone)
	}
	return c.Go(ctx, method, params, onDone)
}

// flush writes the requests start deferred, unless a write under way does.
func (s *Session) flush() {
	s.mu.Lock()
	c := s.conn
	s.mu.Unlock()
	if c != nil {
		// A failure ends the connection, and with it the calls waiting.
		_ = c.Flush()
	}
}

// Handle implements jsonrpc.Handler.
func (s *Session) Handle(ctx context.Context, req *jsonrpc.Request) (any, error) {
	if !s.limiter.Allow() {
		return nil, errRateLimited(s.b.opts.Rate)
	}
	switch req.Method {
	case MethodInitialize, MethodSubscribe, MethodUnsubscribe, MethodSendMessage, MethodPing:
	default:
		return nil, rpcError(jsonrpc.MethodNotFound, "Method not found: %s", req.Method)
	}
	if req.IsNotification() {
		// Nothing could be returned; a publish needs its acks read.
		return nil, nil
	}
	if req.Method == MethodInitialize {
		return s.initialize(ctx, req)
	}
	if err := s.requireInitialized(); err != nil {
		return nil, err
	}
	switch req.Method {
	case MethodSubscribe:
		return s.subscribe(ctx, req)
	case MethodUnsubscribe:
		return s.unsubscribe(req)
	case MethodSendMessage:
		return s.sendMessage(ctx, req)
	default:
		return map[string]string{"timestamp": time.Now().UTC().Format(time.RFC3339)}, nil
	}
}

// admit applies the rate limit and the need for initialize to a call
// other than initialize, as Handle does.
func (s *Session) admit() error {
	if !s.limiter.Allow() {
		return errRateLimited(s.b.opts.Rate)
	}
	return s.requireInitialized()
}

func errRateLimited(rate float64) *jsonrpc.Error {
	return rpcError(CodeRateLimited, "Rate limited: more than %g requests a second", rate)
}

func (s *Session) requireInitialized() error {
	s.mu.Lock()
	ok := s.initialized
	s.mu.Unlock()
	if !ok {
		return rpcError(CodeNotInitialized, "Not initialized: send initialize first")
	}
	return nil
}

// objectParams decodes params that must be a JSON object (or absent) into
// its members, as encoding/json would into the map. Every request takes
// this path, so the members are walked (the frame was checked as JSON)
// and their values kept where they are, not copied; a name with escapes
// or invalid UTF-8 is left to encoding/json.
func objectParams(req *jsonrpc.Request) (map[string]json.RawMessage, *jsonrpc.Error) {
	members := make(map[string]json.RawMessage, 4)
	if len(req.Params) == 0 {
		return members, nil
	}
	plain := true
	err := jsonscan.EachMember(req.Params, func(key, val []byte) bool {
		if bytes.IndexByte(key, '\\') >= 0 || !utf8.Valid(key) {
			plain = false
			return false
		}
		members[string(key)] = json.RawMessage(val[:len(val):len(val)])
		return true
	})
	if !plain {
		members = map[string]json.RawMessage{}
		err = json.Unmarshal(req.Params, &members)
	}
	if err != nil || members == nil {
		return nil, invalidParams("params must be a JSON object")
	}
	return members, nil
}

// stringMember reads a string member of params, which jsonrpc has checked
// to be valid JSON.
func stringMember(m map[string]json.RawMessage, name string) (value string, present bool, err *jsonrpc.Error) {
	raw, ok := m[name]
	if !ok || string(raw) == "null" {
		return "", false, nil
	}
	if n := len(raw); n >= 2 && raw[0] == '"' && raw[n-1] == '"' {
		// Without escapes or bytes json.Unmarshal would replace, the
		// string is its bytes: no decoder to allocate (a publish reads
		// two or three of these).
		if inner := raw[1 : n-1]; bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
			return string(inner), true, nil
		}
	}
	if json.Unmarshal(raw, &value) != nil {
		return "", true, invalidParams("%s must be a string", name)
	}
	return value, true, nil
}

type clientInfo struct {
	Name    string `json:"name"`
	Version string `json:"version"`
}

func (s *Session) initialize(ctx context.Context, req *jsonrpc.Request) (any, error) {
	m, perr := objectParams(req)
	if perr != nil {
		return nil, rpcError(CodeInvalidClientInfo, "Invalid client info: params must be a JSON object")
	}
	clientID, ok, _ := stringMember(m, "clientId")
	if !ok || clientID == "" || len(clientID) > MaxClientIDLen || slices.ContainsFunc([]rune(clientID), unicode.IsControl) {
		return nil, rpcError(CodeInvalidClientInfo, "Invalid client info: clientId must be a non-empty string of at most %d characters without control characters", MaxClientIDLen)
	}
	if raw, ok := m["clientInfo"]; ok && string(raw) != "null" {
		var ci clientInfo
		dec := json.Unmarshal(raw, &ci)
		if dec != nil || raw[0] != '{' {
			return nil, rpcError(CodeInvalidClientInfo, "Invalid client info: clientInfo must be an object with string name and version")
		}
	}
	var caps struct {
		ProcessMessage bool `json:"processMessage"`
	}
	if raw, ok := m["capabilities"]; ok && string(raw) != "null" {
		if json.Unmarshal(raw, &caps) != nil {
			return nil, rpcError(CodeInvalidClientInfo, "Invalid client info: capabilities must be an object")
		}
	}
	defaultTopic, _, derr := stringMember(m, "defaultTopic")
	if derr != nil {
		return nil, rpcError(CodeInvalidClientInfo, "Invalid client info: defaultTopic must be a string")
	}
	token, _, terr := stringMember(m, "token")
	if terr != nil {
		return nil, rpcError(CodeInvalidClientInfo, "Invalid client info: token must be a string")
	}

	// The token and the launched agents are looked up in the store, so
	// before the session's lock.
	grant, gerr := s.resolveGrant(ctx, token)
	launchTopic := grant.launchTopic
	if gerr == nil && launchTopic == "" {
		launchTopic, _ = s.b.launchedAgent(ctx, clientID)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.initialized {
		return nil, rpcError(CodeAlreadyInitialized, "Already initialized")
	}
	if gerr != nil {
		return nil, gerr
	}
	if grant.ClientID != "" && grant.ClientID != clientID {
		return nil, rpcError(CodeForbidden, "Forbidden: this token may only initialize as clientId %q", grant.ClientID)
	}
	perms, err := compileGrant(grant, clientID)
	if err != nil {
		return nil, rpcError(CodeInvalidClientInfo, "Invalid client info: %v", err)
	}
	agent := caps.ProcessMessage
	if launchTopic != "" {
		// An agent the default handler launched is an agent whatever it
		// says, and its default topic is the one it was launched for.
		agent, defaultTopic = true, launchTopic
	}
	if defaultTopic == "" {
		defaultTopic = perms.defaultTopic
	}
	if defaultTopic != "" {
		if err := topic.Validate(defaultTopic); err != nil {
			return nil, rpcError(CodeInvalidClientInfo, "Invalid client info: defaultTopic: %v", err)
		}
	}
	s.initialized, s.clientID, s.agent, s.defaultTopic, s.perms = true, clientID, agent, defaultTopic, perms
	s.launchTopic = launchTopic
	if s.conn == nil {
		s.conn, _ = jsonrpc.ConnFromContext(ctx)
	}
	return InitializeResult{
		ServerID:   s.b.opts.ServerID,
		ServerInfo: ServerInfo{Name: "conclave-bus", Version: s.b.opts.Version},
		Capabilities: Capabilities{
			Subscribe: true, Publish: true,
			Topics:         []string{"inbound:*", "outbound:*", "agent:*", "tg:*", "task:*", "system:*"},
			ProcessMessage: true,
			DefaultTopic:   defaultTopic,
		},
	}, nil
}

// resolveGrant finds the grant of the session: open, from the upgrade, or
// from the token in initialize (one of CONCLAVE_BUS_GRANTS, or one the
// default handler minted for an agent it launched). It reads only what
// does not change after NewSession.
func (s *Session) resolveGrant(ctx context.Context, token string) (Grant, *jsonrpc.Error) {
	switch {
	case s.open:
		return OpenGrant, nil
	case s.grant != nil:
		return *s.grant, nil
	case token == "":
		return Grant{}, rpcError(CodeForbidden, "Unauthenticated: send a bearer token in the Authorization header of the WebSocket upgrade or as token in initialize")
	}
	if wait := s.throttle.Refused(ctx, s.remote); wait > 0 {
		return Grant{}, rpcError(CodeRateLimited, "Rate limited: too many wrong tokens from this address; retry in %s s", auth.RetryAfter(wait))
	}
	if s.access != nil {
		if g, err := s.access.Lookup(token); err == nil {
			return g, nil
		}
	}
	g, err := s.b.LaunchGrant(ctx, token)
	switch {
	case errors.Is(err, ErrUnknownToken):
		s.throttle.Fail(s.remote)
		return Grant{}, rpcError(CodeForbidden, "Unauthenticated: unknown token")
	case err != nil:
		s.b.log.WarnContext(ctx, "bus: checking a launched agent's token", "error", err)
		return Grant{}, rpcError(jsonrpc.InternalError, "Internal error: the token cannot be checked now; retry")
	}
	return g, nil
}

// topicNames are the members a request may name its topic by: the protocol's
// topic, and the address (subscribe, unsubscribe) and to (sendMessage) of
// current bub clients. Every method takes every name.
var topicNames = []string{"topic", "address", "to"}

// errMissingTopic names the members the bus looked for.
const errMissingTopic = `missing topic (looked for "topic", "address" and "to")`

// topicMember returns the topic a request names, by any of topicNames, and
// which name it used; name is "" when the request names none. Two names
// giving different topics are an error naming both.
func topicMember(m map[string]json.RawMessage) (t, name string, _ *jsonrpc.Error) {
	for _, n := range topicNames {
		v, ok, err := stringMember(m, n)
		switch {
		case err != nil:
			return "", "", err
		case !ok:
		case name == "":
			t, name = v, n
		case v != t:
			return "", "", invalidParams("%s %q and %s %q name different topics; send one of them", name, t, n, v)
		}
	}
	if name != "" {
		if err := topic.Validate(t); err != nil {
			return "", "", invalidParams("%s: %v", name, err)
		}
	}
	return t, name, nil
}

func (s *Session) topicParam(m map[string]json.RawMessage) (string, *jsonrpc.Error) {
	t, name, err := topicMember(m)
	if err != nil {
		return "", err
	}
	if name == "" {
		return "", invalidParams(errMissingTopic)
	}
	return t, nil
}

// MaxMessageIDLen bounds the messageId a publisher may give.
const MaxMessageIDLen = 256

// originParams reads the from and messageId of a sendMessage, which
// current bub clients send: both optional strings, passed on to the
// subscribers as given.
func originParams(m map[string]json.RawMessage) (Origin, *jsonrpc.Error) {
	var o Origin
	from, ok, err := stringMember(m, "from")
	if err != nil {
		return o, err
	}
	if ok {
		// An address, as long as a topic may be.
		if !printable(from, topic.MaxLen) {
			return o, invalidParams("from must be a non-empty string of at most %d bytes without control characters", topic.MaxLen)
		}
		o.From = from
	}
	id, ok, err := stringMember(m, "messageId")
	if err != nil {
		return o, err
	}
	if ok {
		if !printable(id, MaxMessageIDLen) {
			return o, invalidParams("messageId must be a non-empty string of at most %d bytes without control characters", MaxMessageIDLen)
		}
		o.MessageID = id
	}
	return o, nil
}

// printable reports whether s is a non-empty UTF-8 string of at most max
// bytes without control characters, which would corrupt log lines.
func printable(s string, max int) bool {
	return s != "" && len(s) <= max && utf8.ValidString(s) && !strings.ContainsFunc(s, unicode.IsControl)
}

func (s *Session) subscribe(ctx context.Context, req *jsonrpc.Request) (any, error) {
	m, perr := objectParams(req)
	if perr != nil {
		return nil, perr
	}
	t, terr := s.topicParam(m)
	if terr != nil {
		return nil, terr
	}
	pattern, _ := topic.Compile(t) // validated by topicParam
	policy := s.b.opts.DefaultPolicy
	suggested, ok, serr := stringMember(m, "policy")
	if serr != nil {
		return nil, serr
	}
	if ok {
		p, err := ParsePolicy(suggested)
		if err != nil {
			return nil, invalidParams("%v", err)
		}
		if s.b.opts.ClientPolicies {
			policy = p
		}
	}
	s.mu.Lock()
	if !s.perms.maySubscribe(t) {
		s.mu.Unlock()
		return nil, rpcError(CodeForbidden, "Forbidden: client %q may not subscribe to %q", s.clientID, t)
	}
	if slices.ContainsFunc(s.subs, func(sub *subscription) bool { return sub.pattern.String() == t }) {
		s.mu.Unlock()
		return nil, rpcError(CodeAlreadySubscribed, "Already subscribed to %q", t)
	}
	if len(s.subs) >= s.b.opts.MaxSubscriptions {
		s.mu.Unlock()
		return nil, rpcError(CodeTooManySubscriptions, "Too many subscriptions: a client may hold at most %d", s.b.opts.MaxSubscriptions)
	}
	sub := &subscription{pattern: pattern, policy: policy, session: s}
	s.subs = append(s.subs, sub)
	clientID, launchTopic := s.clientID, s.launchTopic
	s.mu.Unlock()
	s.b.addSubscription(sub)
	if h := s.b.opts.DefaultHandler; h != nil && launchTopic != "" && pattern.Match(launchTopic) {
		h.agentSubscribed(ctx, clientID, launchTopic)
	}
	return map[string]any{"success": true, "policy": policy}, nil
}

func (s *Session) unsubscribe(req *jsonrpc.Request) (any, error) {
	m, perr := objectParams(req)
	if perr != nil {
		return nil, perr
	}
	t, terr := s.topicParam(m)
	if terr != nil {
		return nil, terr
	}
	s.mu.Lock()
	i := slices.IndexFunc(s.subs, func(sub *subscription) bool { return sub.pattern.String() == t })
	if i < 0 {
		s.mu.Unlock()
		return nil, rpcError(CodeSubscriptionNotFound, "Subscription not found: %q", t)
	}
	sub := s.subs[i]
	s.subs = slices.Delete(s.subs, i, i+1)
	s.mu.Unlock()
	s.b.removeSubscriptions(func(o *subscription) bool { return o == sub })
	return map[string]bool{"success": true}, nil
}

// HandleAsync implements jsonrpc.AsyncHandler: it takes sendMessage on
// the connection's read loop, sends the deliveries from there, and answers
// when the last subscriber's answer comes in (on that subscriber's read
// loop), so a publish costs no goroutine of its own and no wake-up of one.
// Every other method goes to Handle.
func (s *Session) HandleAsync(ctx context.Context, req *jsonrpc.Request, reply func(any, error)) bool {
	if req.Method != MethodSendMessage {
		return false
	}
	if err := s.admit(); err != nil {
		reply(nil, err)
		return true
	}
	clientID, t, payload, origin, err := s.publishParams(req)
	if err != nil {
		reply(nil, err)
		return true
	}
	s.b.publishAsync(ctx, clientID, t, payload, origin, func(res *SendResult, err error) {
		if err != nil {
			reply(nil, err)
			return
		}
		reply(res, nil)
	})
	return true
}

func (s *Session) sendMessage(ctx context.Context, req *jsonrpc.Request) (any, error) {
	clientID, t, payload, origin, err := s.publishParams(req)
	if err != nil {
		return nil, err
	}
	return s.b.publishFrom(ctx, clientID, t, payload, origin)
}

// publishParams checks a sendMessage request and returns who publishes
// what where.
func (s *Session) publishParams(req *jsonrpc.Request) (clientID, t string, payload json.RawMessage, origin Origin, _ error) {
	m, perr := objectParams(req)
	if perr != nil {
		return "", "", nil, origin, perr
	}
	t, name, terr := topicMember(m)
	if terr != nil {
		return "", "", nil, origin, terr
	}
	origin, oerr := originParams(m)
	if oerr != nil {
		return "", "", nil, origin, oerr
	}
	s.mu.Lock()
	clientID, defaultTopic, perms := s.clientID, s.defaultTopic, s.perms
	s.mu.Unlock()
	if name == "" {
		if defaultTopic == "" {
			return "", "", nil, origin, invalidParams(errMissingTopic + ", and this client has no default topic")
		}
		t = defaultTopic
	}
	payload, ok := m["payload"]
	if !ok || len(payload) == 0 || payload[0] != '{' {
		return "", "", nil, origin, invalidParams("payload must be a JSON object")
	}
	if !perms.mayPublish(t) {
		return "", "", nil, origin, rpcError(CodeForbidden, "Forbidden: client %q may not publish to %q", clientID, t)
	}
	return clientID, t, payload, origin, nil
}

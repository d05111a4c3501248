package auth

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Defaults of a Throttle, and of every service's
// CONCLAVE_<SERVICE>_AUTH_THROTTLE (ThrottleSetting): an address may
// present ThrottleBurst wrong tokens at once, and one more every
// ThrottleEvery after that (60 guesses a minute at most, which is nothing
// against a 16-character token and plenty for a person who mistyped one).
const (
	ThrottleBurst        = 20
	ThrottleEvery        = time.Second
	ThrottleMaxAddresses = 10000
)

// Throttle slows down the guessing of tokens: it counts, per remote
// address, the requests that presented a wrong token, and once an address
// has spent its budget every request from it that presents a token is
// refused (429, or RESOURCE_EXHAUSTED) until the budget grows back, right
// token or not: otherwise a guess that hit would still tell itself apart.
// Requests without a token are not counted; they guess nothing.
//
// The address is the connection's remote address, never a header such as
// X-Forwarded-For that a client writes itself. Behind a proxy it is the
// proxy's, so the clients behind one proxy share its budget. IPv6
// addresses count by their /64, the block one host usually holds.
//
// Memory is bounded: at most MaxAddresses are tracked; when that many are,
// the ones whose budget is whole again are forgotten, and if none is, an
// arbitrary one is.
type Throttle struct {
	// self marks the calls of this process's own REST front (SelfDialOption),
	// which checked its caller's address itself.
	self      string
	burst     float64
	every     time.Duration
	max       int
	now       func() time.Time
	throttled func(ctx context.Context)

	mu    sync.Mutex
	addrs map[netip.Prefix]*budget
}

type budget struct {
	tokens float64 // failures still allowed
	at     time.Time
}

// ThrottleOptions tune a Throttle; zero fields take the package defaults.
type ThrottleOptions struct {
	Burst        int
	Every        time.Duration
	MaxAddresses int
	// Throttled is called for each request refused because its address
	// is throttled: a metric's counter.
	Throttled func(ctx context.Context)
	// Now is the clock (nil: time.Now); tests move it.
	Now func() time.Time
}

// NewThrottle returns a Throttle.
func NewThrottle(o ThrottleOptions) *Throttle {
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	th := &Throttle{self: hex.EncodeToString(secret), burst: float64(o.Burst), every: o.Every, max: o.MaxAddresses, now: o.Now, throttled: o.Throttled,
		addrs: map[netip.Prefix]*budget{}}
	if th.burst <= 0 {
		th.burst = ThrottleBurst
	}
	if th.every <= 0 {
		th.every = ThrottleEvery
	}
	if th.max <= 0 {
		th.max = ThrottleMaxAddresses
	}
	if th.now == nil {
		th.now = time.Now
	}
	if th.throttled == nil {
		th.throttled = func(context.Context) {}
	}
	return th
}

// addrKey is what failures are counted under: the IPv4 address, or the
// IPv6 /64. ok is false for an address that is not an IP (a Unix socket, a
// test's pipe): those are not throttled.
func addrKey(remote string) (netip.Prefix, bool) {
	host := remote
	if h, _, err := net.SplitHostPort(remote); err == nil {
		host = h
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Prefix{}, false
	}
	ip = ip.Unmap().WithZone("")
	bits := 32
	if ip.Is6() {
		bits = 64
	}
	p, _ := ip.Prefix(bits)
	return p, true
}

// refill brings b up to date; the caller holds th.mu.
func (th *Throttle) refill(b *budget, now time.Time) {
	if elapsed := now.Sub(b.at); elapsed > 0 {
		b.tokens = min(th.burst, b.tokens+float64(elapsed)/float64(th.every))
		b.at = now
	}
}

// Wait returns how long the address remote must wait before it may try a
// token again: zero when it may now. A nil Throttle throttles nothing.
func (th *Throttle) Wait(remote string) time.Duration {
	if th == nil {
		return 0
	}
	key, ok := addrKey(remote)
	if !ok {
		return 0
	}
	now := th.now()
	th.mu.Lock()
	defer th.mu.Unlock()
	b := th.addrs[key]
	if b == nil {
		return 0
	}
	th.refill(b, now)
	if b.tokens >= 1 {
		return 0
	}
	return time.Duration((1 - b.tokens) * float64(th.every))
}

// Fail counts one wrong token from the address remote.
func (th *Throttle) Fail(remote string) {
	if th == nil {
		return
	}
	key, ok := addrKey(remote)
	if !ok {
		return
	}
	now := th.now()
	th.mu.Lock()
	defer th.mu.Unlock()
	b := th.addrs[key]
	if b == nil {
		if len(th.addrs) >= th.max {
			th.evict(now)
		}
		b = &budget{tokens: th.burst, at: now}
		th.addrs[key] = b
	}
	th.refill(b, now)
	b.tokens = max(b.tokens-1, 0)
}

// evict makes room for one more address; the caller holds th.mu.
func (th *Throttle) evict(now time.Time) {
	for k, b := range th.addrs {
		if th.refill(b, now); b.tokens >= th.burst {
			delete(th.addrs, k)
		}
	}
	for k := range th.addrs {
		if len(th.addrs) < th.max {
			break
		}
		delete(th.addrs, k) // map order: an arbitrary one
	}
}

// RetryAfter is a Retry-After value for wait: whole seconds, at least 1.
func RetryAfter(wait time.Duration) string {
	return strconv.FormatInt(max(int64((wait+time.Second-1)/time.Second), 1), 10)
}

// ThrottledMessage is what a throttled request is told.
const ThrottledMessage = "too many wrong tokens from this address; retry later"

// Refused is the check of one request that presents a token, from the
// address remote: how long it must wait, counted as a throttled request
// when it must (a positive wait), or zero when it may go on.
func (th *Throttle) Refused(ctx context.Context, remote string) time.Duration {
	if th == nil {
		return 0
	}
	wait := th.Wait(remote)
	if wait > 0 {
		th.throttled(ctx)
	}
	return wait
}

// HTTP is the check of one HTTP request that presents a token: when its
// address is throttled it sets Retry-After, counts the refusal and
// returns false, and the caller answers 429 in its own error shape.
func (th *Throttle) HTTP(w http.ResponseWriter, r *http.Request) bool {
	wait := th.Refused(r.Context(), r.RemoteAddr)
	if wait <= 0 {
		return true
	}
	w.Header().Set("Retry-After", RetryAfter(wait))
	return false
}

// FailHTTP counts the wrong token r presented.
func (th *Throttle) FailHTTP(r *http.Request) { th.Fail(r.RemoteAddr) }

// peerAddr is the remote address of a gRPC call, or "".
func peerAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}

// GRPC runs check, the token check of a gRPC call, under the throttle:
// RESOURCE_EXHAUSTED, with a RetryInfo detail and "retry-after" trailer
// (seconds), while the caller's address is throttled; and an
// UNAUTHENTICATED answer to a call that presented a token counts as a
// failure.
func (th *Throttle) GRPC(ctx context.Context, check func(context.Context) error) error {
	if th == nil {
		return check(ctx)
	}
	_, presented := FromIncomingContext(ctx)
	if presented && th.fromSelf(ctx) {
		// A REST front's call: its caller's address, which this one is
		// not, has been checked and counted already.
		return check(ctx)
	}
	addr := peerAddr(ctx)
	if presented {
		if wait := th.Refused(ctx, addr); wait > 0 {
			_ = grpc.SetTrailer(ctx, metadata.Pairs("retry-after", RetryAfter(wait)))
			st, _ := status.New(codes.ResourceExhausted, ThrottledMessage).
				WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(wait)})
			return st.Err()
		}
	}
	err := check(ctx)
	if presented && status.Code(err) == codes.Unauthenticated {
		th.Fail(addr)
	}
	return err
}

// selfKey is the metadata key of SelfDialOptions' mark.
const selfKey = "x-conclave-throttle-self"

// SelfDialOptions mark the calls of a client of this process's own gRPC
// listener (a REST front, server.SelfClient) so that the throttle does not
// count them against that client's address: the front throttled its own
// caller's address before. The mark is a secret made for this Throttle,
// which never leaves the process, so no other caller can claim it.
func (th *Throttle) SelfDialOptions() []grpc.DialOption {
	mark := func(ctx context.Context) context.Context {
		return metadata.AppendToOutgoingContext(ctx, selfKey, th.self)
	}
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			return invoker(mark(ctx), method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			return streamer(mark(ctx), desc, cc, method, opts...)
		}),
	}
}

// fromSelf reports whether ctx's call carries this Throttle's mark.
func (th *Throttle) fromSelf(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get(selfKey) {
		if subtle.ConstantTimeCompare([]byte(v), []byte(th.self)) == 1 {
			return true
		}
	}
	return false
}

package testenv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"time"
)

// LambdaResult is one invocation's outcome: the response payload, or the error
// the function reported.
type LambdaResult struct {
	Payload   json.RawMessage
	ErrorType string
	Error     json.RawMessage
}

type invocation struct {
	id      string
	event   []byte
	headers map[string]string
	result  chan LambdaResult
}

// LambdaRuntime is a Runtime API endpoint and the bootstrap process it
// serves: it runs a real Lambda bootstrap binary as the Lambda service does,
// serving the Runtime API (/2018-06-01/runtime/invocation/next, /response,
// /error, /init/error) on loopback, starting the binary with
// AWS_LAMBDA_RUNTIME_API pointing at it, and handing it events one at a
// time. The Librarian's tests and benchmarks use it, and the end-to-end
// scenario serves it over HTTP as API Gateway does (APIGateway).
type LambdaRuntime struct {
	// Addr is host:port, the AWS_LAMBDA_RUNTIME_API value.
	Addr string

	srv     *http.Server
	pending chan *invocation
	mu      sync.Mutex
	flight  map[string]*invocation
	seq     int
	initErr chan json.RawMessage
	polled  chan struct{}
	pollOne sync.Once

	cmd    *exec.Cmd
	output *LockedBuffer
	exited chan struct{}
}

// StartLambda serves the Runtime API and starts bin with env added to this
// process's environment.
func StartLambda(bin string, env ...string) (*LambdaRuntime, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	rt := &LambdaRuntime{Addr: l.Addr().String(), pending: make(chan *invocation), flight: map[string]*invocation{},
		initErr: make(chan json.RawMessage, 1), polled: make(chan struct{}), output: &LockedBuffer{}, exited: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /2018-06-01/runtime/invocation/next", rt.next)
	mux.HandleFunc("POST /2018-06-01/runtime/invocation/{id}/response", rt.finish(""))
	mux.HandleFunc("POST /2018-06-01/runtime/invocation/{id}/error", rt.finish("error"))
	mux.HandleFunc("POST /2018-06-01/runtime/init/error", rt.initError)
	rt.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = rt.srv.Serve(l) }()

	rt.cmd = exec.Command(bin)
	rt.cmd.Env = append(os.Environ(), append(env, "AWS_LAMBDA_RUNTIME_API="+rt.Addr)...)
	rt.cmd.Stdout, rt.cmd.Stderr = rt.output, rt.output
	if err := rt.cmd.Start(); err != nil {
		_ = rt.srv.Close()
		return nil, err
	}
	go func() { _ = rt.cmd.Wait(); close(rt.exited) }()
	return rt, nil
}

// Ready waits until the function has initialized and asks for its first
// event, or reports why it never will (an init error, an exit).
func (rt *LambdaRuntime) Ready(ctx context.Context) error {
	select {
	case <-rt.polled:
		return nil
	case e := <-rt.initErr:
		rt.initErr <- e
		return fmt.Errorf("init error: %s", e)
	case <-rt.exited:
		return fmt.Errorf("bootstrap exited during init:\n%s", rt.output)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// InitError waits for the function to report an init error, and returns it.
func (rt *LambdaRuntime) InitError(ctx context.Context) (json.RawMessage, error) {
	select {
	case e := <-rt.initErr:
		rt.initErr <- e
		return e, nil
	case <-rt.polled:
		return nil, errors.New("the function initialized")
	case <-ctx.Done():
		return nil, fmt.Errorf("%w; output:\n%s", ctx.Err(), rt.output)
	}
}

// Invoke hands the function one event and waits for its outcome. headers
// add to the invocation's Runtime API headers (e.g. Lambda-Runtime-Trace-Id).
func (rt *LambdaRuntime) Invoke(ctx context.Context, event []byte, headers map[string]string) (LambdaResult, error) {
	rt.mu.Lock()
	rt.seq++
	inv := &invocation{id: "inv-" + strconv.Itoa(rt.seq), event: event, headers: headers, result: make(chan LambdaResult, 1)}
	rt.mu.Unlock()
	select {
	case rt.pending <- inv:
	case <-rt.exited:
		return LambdaResult{}, fmt.Errorf("bootstrap exited:\n%s", rt.output)
	case <-ctx.Done():
		return LambdaResult{}, ctx.Err()
	}
	select {
	case r := <-inv.result:
		return r, nil
	case <-rt.exited:
		return LambdaResult{}, fmt.Errorf("bootstrap exited during an invocation:\n%s", rt.output)
	case <-ctx.Done():
		return LambdaResult{}, ctx.Err()
	}
}

// Output is what the function wrote to stdout and stderr.
func (rt *LambdaRuntime) Output() string { return rt.output.String() }

// Stop ends the function (SIGTERM, then SIGKILL) and the endpoint.
func (rt *LambdaRuntime) Stop() {
	if rt.cmd.Process != nil {
		_ = rt.cmd.Process.Signal(os.Interrupt)
		select {
		case <-rt.exited:
		case <-time.After(2 * time.Second):
			_ = rt.cmd.Process.Kill()
			<-rt.exited
		}
	}
	_ = rt.srv.Close()
}

// Kill ends the function with SIGKILL, as a crash or a Lambda timeout
// does: it gets no chance to finish what it was doing.
func (rt *LambdaRuntime) Kill() {
	if rt.cmd.Process != nil {
		_ = rt.cmd.Process.Kill()
		<-rt.exited
	}
}

// Exited is closed when the process has ended.
func (rt *LambdaRuntime) Exited() <-chan struct{} { return rt.exited }

func (rt *LambdaRuntime) next(w http.ResponseWriter, r *http.Request) {
	rt.pollOne.Do(func() { close(rt.polled) })
	select {
	case inv := <-rt.pending:
		rt.mu.Lock()
		rt.flight[inv.id] = inv
		rt.mu.Unlock()
		h := w.Header()
		h.Set("Lambda-Runtime-Aws-Request-Id", inv.id)
		h.Set("Lambda-Runtime-Deadline-Ms", strconv.FormatInt(time.Now().Add(30*time.Second).UnixMilli(), 10))
		h.Set("Lambda-Runtime-Invoked-Function-Arn", "arn:aws:lambda:us-east-1:000000000000:function:librarian")
		for k, v := range inv.headers {
			h.Set(k, v)
		}
		h.Set("Content-Type", "application/json")
		_, _ = w.Write(inv.event)
	case <-r.Context().Done():
	}
}

func (rt *LambdaRuntime) finish(kind string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rt.mu.Lock()
		inv := rt.flight[r.PathValue("id")]
		delete(rt.flight, r.PathValue("id"))
		rt.mu.Unlock()
		if inv == nil {
			http.Error(w, `{"errorMessage":"unknown request id"}`, http.StatusBadRequest)
			return
		}
		res := LambdaResult{Payload: body}
		if kind == "error" {
			res = LambdaResult{Error: body, ErrorType: r.Header.Get("Lambda-Runtime-Function-Error-Type")}
		}
		inv.result <- res
		w.WriteHeader(http.StatusAccepted)
		_, _ = w.Write([]byte(`{"status":"OK"}`))
	}
}

func (rt *LambdaRuntime) initError(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	select {
	case rt.initErr <- body:
	default:
	}
	w.WriteHeader(http.StatusAccepted)
	_, _ = w.Write([]byte(`{"status":"OK"}`))
}

// Package jsonrpc implements JSON-RPC 2.0 framing and a bidirectional
// connection for the protocols Conclave speaks over it: the bus's WebSocket
// protocol, ACP over an agent process's stdio, and MCP.
//
// It exists because those protocols need things the common Go libraries do
// not give together:
//
//   - Both ends send requests on one connection. An ACP agent calls
//     session/request_permission while our session/prompt is in flight, and
//     the bus calls sendMessage on a subscriber that is itself publishing.
//   - A malformed frame is answered with the spec's ParseError or
//     InvalidRequest and the connection carries on, instead of dropping a
//     session that may have taken minutes to set up.
//   - Batches, frame size limits, and cancellation that reaches the peer's
//     handler ($/cancelRequest by default, configurable for ACP and MCP).
//   - W3C trace context travels in params._meta.traceparent, so one request
//     is one trace across the bus, the runner and the agent.
//
// Ordering follows what ACP clients rely on: notifications are handled one at
// a time in arrival order (streamed session/update chunks must not be
// reordered), and a response is delivered only after every notification that
// arrived before it has been handled. Requests run concurrently, each on its
// own goroutine, up to a configurable limit.
package jsonrpc

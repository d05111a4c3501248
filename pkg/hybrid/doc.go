// Package hybrid runs one-shot agents with the ADK bridge's hybrid
// protocol (docs/protocols.md, docs/bridge.md): selected parameters as command-line arguments, the
// complete parameters as one JSON object on stdin, one JSON object back on
// stdout, logs on stderr, and an exit code (0 success, 1 error, 2+ specific
// errors).
//
// It is the execution core shared by the bridge (services/bridge), which
// exposes such agents as MCP tools, and the runner's `protocol: oneshot`
// agents. It validates parameters, builds the argument vector (never a shell
// command line), runs the agent in its own process group with a timeout and a
// stdout limit, and turns everything that can go wrong into an *Error of a
// fixed Kind, whose message has the ADK bridge's form ("Validation error: ...").
package hybrid

// Package bus will hold the WebSocket JSON-RPC 2.0 bus of seed 004 (bub):
// publish/subscribe over fnmatch-style topic patterns on :7892, with retries
// and dead letters through SQS. Only the module exists so far; see
// docs/architecture.md for what it may import.
package bus

// Package bus is the WebSocket JSON-RPC 2.0 agent bus of the bub protocol:
// publish/subscribe over fnmatch-style topic patterns on :7892, agent
// delivery with processMessage, durable retries and dead letters, a
// default handler that launches agents, and access control per bearer
// token. See docs/bus.md; the entry point is package service.
package bus

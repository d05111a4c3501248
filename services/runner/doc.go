// Package runner is the ACP runner of Kandev's protocol: the /api/v1/agents
// and /api/v1/tasks REST API over a gRPC service, driving agents over
// JSON-RPC on stdio. cmd/runner runs it; service is its one exported
// package; docs/runner.md describes it.
package runner

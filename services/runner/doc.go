// Package runner will hold the ACP runner of seed 002 (Kandev): the
// /api/v1/agents and /api/v1/tasks REST API over a gRPC service, driving
// agents over JSON-RPC on stdio as local processes or Kubernetes Jobs. Only
// the module exists so far; see docs/architecture.md.
package runner

// Package bridge will hold the ADK tool bridge of seed 000 as an MCP server:
// configured tool agents run with the hybrid protocol (CLI arguments and JSON
// on stdin, one JSON object on stdout). Only the module exists so far; see
// docs/architecture.md.
package bridge

// Package backends holds the contract tests of the Librarian's state
// (requests, knowledge graph, rate limits, tokens) run against both store
// backends: the embedded file and DynamoDB (dynalite).
package backends

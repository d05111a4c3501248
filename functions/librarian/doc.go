// Package librarian will hold the Librarian governance API of seed 003 as an
// AWS Lambda behind API Gateway, and the same handler over plain HTTP on
// :8081 for conclave dev. Only the module exists so far; see
// docs/architecture.md.
package librarian

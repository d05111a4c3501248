// Package e2e is Conclave's end-to-end scenario (issue 15, docs/e2e.md): the
// whole system driven through its public interfaces, as a user drives it,
// each step checked for its result and for one trace across its hops in a
// real Jaeger. The scenario is written once (scenario_test.go) against a
// shape, the way the system is deployed: TestOneProcess runs it on `conclave
// dev`, TestSplitProcesses on each deployable as its own process on the AWS
// path (dynalite and fauxqs, the Librarian under a Lambda Runtime API).
//
// The package has no code outside its tests; run it with `make e2e`.
package e2e

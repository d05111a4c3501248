// Package kubetest holds the runner's tests on a real single-node
// Kubernetes cluster (pkg/testenv KubeNode), where agents' pods actually
// run: the Kubernetes executor, agent-host's link, the chart's RBAC and one
// trace across them. It has no code of its own.
package kubetest

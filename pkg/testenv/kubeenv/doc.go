// Package kubeenv starts real Kubernetes for tests: Kube, a kube-apiserver
// and etcd (envtest) where objects are stored and nothing runs them, and
// KubeNode, a whole single-node cluster in a network namespace of its own
// where pods run (docs/testing.md). Its binaries are built from the tools
// modules by scripts/build-test-tools.sh, as package testenv's are. It is
// apart from testenv so that only the tests that start Kubernetes link
// client-go and envtest.
package kubeenv

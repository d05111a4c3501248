// Package kubetest installs the Helm chart helm/conclave on a real
// single-node Kubernetes cluster (pkg/testenv KubeNode, with kube-proxy
// routing Services), with the gateway, bus, runner and console images built
// offline as `make images` builds them, and the aws backend on dynalite and
// fauxqs: the pods become Ready, the gateway takes an agent and a client's
// message through its Service, the console signs in through its Service
// and streams a chat with that agent, the runner's ServiceAccount can do
// what the Kubernetes executor (the chart's default) does and nothing
// more, the runner launches the chart's example agent as a Job whose pod
// runs as the agents' ServiceAccount, which may do nothing and mounts no
// token, an upgrade rolls the pods (and the console's sessions outlive
// them), and an uninstall leaves nothing of the release. It has no code
// of its own.
package kubetest

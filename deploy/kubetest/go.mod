module github.com/conclave-ai/conclave/deploy/kubetest

go 1.26.8

replace (
	github.com/conclave-ai/conclave/pkg => ../../pkg
	github.com/conclave-ai/conclave/proto => ../../proto
)

require (
	github.com/conclave-ai/conclave/pkg v0.0.0-00010101000000-000000000000
	github.com/conclave-ai/conclave/proto v0.0.0-00010101000000-000000000000
	google.golang.org/grpc v1.85.0
	k8s.io/api v0.34.4
	k8s.io/apimachinery v0.34.4
	k8s.io/client-go v0.34.4
	sigs.k8s.io/yaml v1.6.0
)

module github.com/conclave-ai/conclave/helm

go 1.26.8

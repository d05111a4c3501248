module github.com/conclave-ai/conclave/services/runner

go 1.26.8

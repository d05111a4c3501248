module github.com/conclave-ai/conclave/examples/acp-agent

go 1.26.8

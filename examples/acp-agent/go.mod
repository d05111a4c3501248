module github.com/conclave-ai/conclave/examples/acp-agent

go 1.26.8

require github.com/coder/websocket v1.8.15

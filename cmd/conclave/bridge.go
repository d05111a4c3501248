package main

import (
	"context"
	"io"
	"os"

	bridge "github.com/conclave-ai/conclave/services/bridge/service"
)

// runBridge is `conclave bridge`: run, list, health, diagnose and mcp
// (stdio) for the tool bridge's agents.
func runBridge(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	out, ok := stdout.(io.WriteCloser)
	if !ok {
		out = nopCloser{stdout}
	}
	return bridge.Main(ctx, "conclave bridge", args, os.LookupEnv, bridge.IO{Stdin: os.Stdin, Stdout: out, Stderr: stderr}, versionString())
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }

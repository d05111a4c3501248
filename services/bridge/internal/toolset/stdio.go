package toolset

import (
	"errors"
	"io"
	"os"
	"strings"
	"syscall"
)

// isClosedPipe reports whether err only says that the client closed its end
// of the stdio pipes, which is how a stdio MCP session normally ends.
func isClosedPipe(err error) bool {
	return err == nil || errors.Is(err, io.EOF) || errors.Is(err, io.ErrClosedPipe) ||
		errors.Is(err, os.ErrClosed) || errors.Is(err, syscall.EPIPE) ||
		// The SDK reports a client that closed stdin with requests still in
		// flight as "server is closing: EOF", formatting the cause with %v.
		strings.HasSuffix(err.Error(), ": "+io.EOF.Error())
}

package service

import (
	"errors"
	"io"
	"os"
	"syscall"
)

// isClosedPipe reports whether err only says that the client closed its end
// of the stdio pipes, which is how a stdio MCP session normally ends.
func isClosedPipe(err error) bool {
	return err == nil || errors.Is(err, io.EOF) || errors.Is(err, io.ErrClosedPipe) ||
		errors.Is(err, os.ErrClosed) || errors.Is(err, syscall.EPIPE)
}

package server

import (
	"errors"

	"google.golang.org/grpc/status"
)

// Hide returns an error that a gRPC client sees as st and whose cause (a
// store's or a peer's error, which may name keys, addresses or the
// caller's own input) stays on the server: the server's gRPC logging logs
// it at error level, with the call's trace id. Its Error is st's message
// alone, so no wrapping can carry the cause to a client; errors.Is and
// errors.As still reach it.
func Hide(st *status.Status, cause error) error {
	return &hiddenError{st: st, cause: cause}
}

type hiddenError struct {
	st    *status.Status
	cause error
}

func (e *hiddenError) Error() string              { return e.st.Message() }
func (e *hiddenError) GRPCStatus() *status.Status { return e.st }
func (e *hiddenError) Unwrap() error              { return e.cause }

// HiddenCause returns the cause Hide kept out of err's status, if err
// carries one.
func HiddenCause(err error) (error, bool) {
	if h, ok := errors.AsType[*hiddenError](err); ok {
		return h.cause, true
	}
	return nil, false
}

package acp

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/conclave-ai/conclave/pkg/jsonrpc"
)

// Outcomes of a handshake (initialize, authenticate, session/new or
// session/load) that failed, as HandshakeFailure tells them apart.
const (
	// OutcomeDeadProtocol: the agent did not answer in time.
	OutcomeDeadProtocol = "dead_protocol"
	// OutcomeAgentError: the agent answered with a JSON-RPC error, such as
	// a missing API key; its message is the reason.
	OutcomeAgentError = "agent_error"
	// OutcomeProtocolError: the agent answered with something the protocol
	// does not allow (no sessionId, a protocolVersion of neither dialect).
	OutcomeProtocolError = "protocol_error"
	// OutcomeExited: the agent exited before it answered.
	OutcomeExited = "exited"
	// OutcomeBadType: the agent type asks for what the agent does not
	// offer (an auth_method it does not list).
	OutcomeBadType = "bad_type"
)

// HandshakeFailure says how the handshake call method failed with err
// (timeout: the limit it had): an outcome (the Outcome* constants) and a
// reason for the instance's status. An agent error from an agent that
// offers authMethods, when Options.AuthMethod names none, says which it
// offers.
func (c *Client) HandshakeFailure(method string, err error, timeout time.Duration) (outcome, reason string) {
	caps, authMethod := c.Capabilities(), c.opts.AuthMethod
	var rpcErr *jsonrpc.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return OutcomeDeadProtocol, fmt.Sprintf("dead protocol: no answer to %s within %s", method, timeout)
	case errors.Is(err, ErrAuthMethod):
		return OutcomeBadType, fmt.Sprintf("the agent type's auth_method %q is not one the agent offers; it offers %s", authMethod, caps.OfferedAuth())
	case errors.As(err, &rpcErr):
		reason = fmt.Sprintf("%s: the agent answered with an error: %s (code %d)", method, summary(rpcErr.Message), rpcErr.Code)
		if len(rpcErr.Data) > 0 && string(rpcErr.Data) != "null" {
			reason += ": " + summary(string(rpcErr.Data))
		}
		if len(caps.AuthMethods) > 0 && authMethod == "" {
			reason += "; the agent offers authMethods " + caps.OfferedAuth() + ", and the agent type names none in auth_method"
		}
		return OutcomeAgentError, reason
	case errors.Is(err, ErrAgentGone):
		return OutcomeExited, fmt.Sprintf("the agent exited before it answered %s", method)
	}
	// The client's errors start with the method's name.
	return OutcomeProtocolError, summary(err.Error())
}

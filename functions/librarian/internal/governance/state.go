// Package governance is the Librarian's domain: the states a request moves
// through, and the validation pipeline of the Librarian protocol, one rule
// per unit, that decides it.
package governance

import (
	"errors"
	"fmt"
)

// State is where a request is in the governance workflow.
type State string

// The protocol's states, plus CLARIFICATION_NEEDED: a request the pipeline
// could not decide because a field was ambiguous. It ends there; the agent
// resubmits a clearer request.
const (
	Pending             State = "PENDING"
	Validating          State = "VALIDATING"
	Approved            State = "APPROVED"
	Rejected            State = "REJECTED"
	Escalated           State = "ESCALATED"
	ClarificationNeeded State = "CLARIFICATION_NEEDED"
	Completed           State = "COMPLETED"
)

// transitions are the legal moves: PENDING → VALIDATING → a decision; a
// human decides an escalated request; a REPORT completes an approved one.
var transitions = map[State][]State{
	Pending:    {Validating},
	Validating: {Approved, Rejected, Escalated, ClarificationNeeded},
	Escalated:  {Approved, Rejected},
	Approved:   {Completed},
}

// ErrIllegalTransition is returned for a move the workflow does not allow;
// the API answers it with 409.
var ErrIllegalTransition = errors.New("illegal state transition")

// Transition checks the move from → to.
func Transition(from, to State) error {
	for _, s := range transitions[from] {
		if s == to {
			return nil
		}
	}
	return fmt.Errorf("%w: a %s request cannot become %s", ErrIllegalTransition, from, to)
}

// Terminal reports whether nothing can happen to a request in s any more.
func (s State) Terminal() bool { return len(transitions[s]) == 0 }

// Status is the lower-case name the API shows: the protocol's response statuses
// (approved, rejected, escalated, clarification_needed) and the request
// statuses around them.
func (s State) Status() string {
	switch s {
	case Pending:
		return "submitted"
	case Validating:
		return "validating"
	case Approved:
		return "approved"
	case Rejected:
		return "rejected"
	case Escalated:
		return "escalated"
	case ClarificationNeeded:
		return "clarification_needed"
	case Completed:
		return "completed"
	}
	return string(s)
}

// ParseStatus is the inverse of Status.
func ParseStatus(status string) (State, bool) {
	for _, s := range []State{Pending, Validating, Approved, Rejected, Escalated, ClarificationNeeded, Completed} {
		if s.Status() == status {
			return s, true
		}
	}
	return "", false
}

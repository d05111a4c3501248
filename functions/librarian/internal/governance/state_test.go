package governance_test

import (
	"errors"
	"testing"

	"github.com/conclave-ai/conclave/functions/librarian/internal/governance"
)

func TestTransitions(t *testing.T) {
	t.Parallel()
	all := []governance.State{governance.Pending, governance.Validating, governance.Approved, governance.Rejected,
		governance.Escalated, governance.ClarificationNeeded, governance.Completed}
	legal := map[[2]governance.State]bool{
		{governance.Pending, governance.Validating}:             true,
		{governance.Validating, governance.Approved}:            true,
		{governance.Validating, governance.Rejected}:            true,
		{governance.Validating, governance.Escalated}:           true,
		{governance.Validating, governance.ClarificationNeeded}: true,
		{governance.Escalated, governance.Approved}:             true,
		{governance.Escalated, governance.Rejected}:             true,
		{governance.Approved, governance.Completed}:             true,
	}
	for _, from := range all {
		for _, to := range all {
			err := governance.Transition(from, to)
			if legal[[2]governance.State{from, to}] != (err == nil) {
				t.Errorf("%s → %s: %v", from, to, err)
			}
			if err != nil && !errors.Is(err, governance.ErrIllegalTransition) {
				t.Errorf("%s → %s: %v is not ErrIllegalTransition", from, to, err)
			}
		}
		if st, ok := governance.ParseStatus(from.Status()); !ok || st != from {
			t.Errorf("ParseStatus(%q) = %s, %v", from.Status(), st, ok)
		}
	}
	for _, s := range []governance.State{governance.Rejected, governance.ClarificationNeeded, governance.Completed} {
		if !s.Terminal() {
			t.Errorf("%s is not terminal", s)
		}
	}
	if governance.Escalated.Terminal() || governance.Approved.Terminal() {
		t.Error("escalated and approved requests can still move")
	}
}

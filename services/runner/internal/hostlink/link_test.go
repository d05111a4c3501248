package hostlink

import (
	"context"
	"time"

	"github.com/conclave-ai/conclave/services/runner/internal/acp"
)

// conversation is the supervisor's interface (supervisor/oneshot.go),
// copied: a Link must satisfy it exactly, for the supervisor to converse
// through one as through a local ACP client.
type conversation interface {
	BeginTurn() uint64
	AbandonTurn()
	Prompt(ctx context.Context, message string, acceptTimeout time.Duration) (acp.Turn, error)
	CancelTurn(ctx context.Context, reason string, id uint64) error
	Done() <-chan struct{}
}

var _ conversation = (*Link)(nil)

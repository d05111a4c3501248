package hostlink

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/services/runner/internal/acp"
)

// permissions records the permission requests a link's runner side is
// asked to decide, and decides them with answer.
type permissions struct {
	mu     sync.Mutex
	asked  []PermissionRequest
	answer func(ctx context.Context) acp.PermissionAnswer
}

func (p *permissions) decide(ctx context.Context, req PermissionRequest) acp.PermissionAnswer {
	p.mu.Lock()
	p.asked = append(p.asked, req)
	p.mu.Unlock()
	return p.answer(ctx)
}

func (p *permissions) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.asked)
}

// TestGovernedPermissions: under the librarian policy agent-host relays
// the agent's permission request to the runner, whose answer the agent
// gets (allowed: it writes its file; refused: it does not); a runner that
// restarts while the request waits is sent it again and its answer counts.
func TestGovernedPermissions(t *testing.T) {
	integration(t)
	allow := func(context.Context) acp.PermissionAnswer {
		return acp.PermissionAnswer{Allow: true, Meta: map[string]any{"decision": "approved"}}
	}
	refuse := func(context.Context) acp.PermissionAnswer {
		return acp.PermissionAnswer{Meta: map[string]any{"decision": "rejected"}}
	}
	for _, tt := range []struct {
		name    string
		answer  func(context.Context) acp.PermissionAnswer
		written bool
	}{{"allowed", allow, true}, {"refused", refuse, false}} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rig := startHub(t, "")
			rec := newRecorder()
			perms := &permissions{answer: tt.answer}
			opts := rec.options()
			opts.OnPermission = perms.decide
			link := rig.hub.Expect("inst-perm-"+tt.name, 1, opts)
			ws := t.TempDir()
			p := startHost(t, hostSpec{addr: rig.addr, instance: "inst-perm-" + tt.name, workspace: ws, agent: []string{acpAgentBin},
				env: map[string]string{"CONCLAVE_AGENT_HOST_PERMISSION": "librarian"}})
			tr, err := link.PromptTurn(t.Context(), 1, "go", acceptTimeout)
			if err != nil || tr.StopReason != acp.StopEndTurn {
				t.Fatalf("turn = %+v, %v", tr, err)
			}
			if perms.count() != 1 {
				t.Fatalf("asked %d times", perms.count())
			}
			var params struct {
				ToolCall struct {
					ToolCallID string `json:"toolCallId"`
				} `json:"toolCall"`
			}
			if err := json.Unmarshal(perms.asked[0].Params, &params); err != nil || params.ToolCall.ToolCallID != "call_1" || perms.asked[0].Workspace != ws {
				t.Fatalf("asked %+v (%v)", perms.asked[0], err)
			}
			if got := fileExists(ws, "notes.txt"); got != tt.written {
				t.Fatalf("notes.txt written: %v, want %v; updates %q", got, tt.written, rec.texts())
			}
			closeAndExit(t, link, p)
		})
	}

	t.Run("runner restarted mid-wait", func(t *testing.T) {
		t.Parallel()
		rig1 := startHub(t, "")
		asked1 := make(chan struct{}, 1)
		perms1 := &permissions{answer: func(ctx context.Context) acp.PermissionAnswer {
			asked1 <- struct{}{}
			<-ctx.Done() // the person has not decided when this runner stops
			return acp.PermissionAnswer{Meta: map[string]any{"decision": "cancelled"}}
		}}
		opts1 := newRecorder().options()
		opts1.OnPermission = perms1.decide
		link1 := rig1.hub.Expect("inst-perm-restart", 1, opts1)
		ws := t.TempDir()
		p := startHost(t, hostSpec{addr: rig1.addr, instance: "inst-perm-restart", workspace: ws, agent: []string{acpAgentBin},
			env: map[string]string{"CONCLAVE_AGENT_HOST_PERMISSION": "librarian"}})
		go func() { _, _ = link1.PromptTurn(context.WithoutCancel(t.Context()), 1, "go", acceptTimeout) }()
		select {
		case <-asked1:
		case <-time.After(time.Minute):
			t.Fatal("the first runner was not asked within a minute")
		}
		rig1.stop()

		rig2 := startHub(t, rig1.addr)
		perms2 := &permissions{answer: allow}
		rec2 := newRecorder()
		opts2 := rec2.options()
		opts2.OnPermission = perms2.decide
		link2 := rig2.hub.Expect("inst-perm-restart", 1, opts2)
		tr, err := link2.PromptTurn(t.Context(), 1, "go", acceptTimeout)
		if err != nil || tr.StopReason != acp.StopEndTurn {
			t.Fatalf("turn = %+v, %v", tr, err)
		}
		if perms2.count() != 1 || !fileExists(ws, "notes.txt") {
			t.Fatalf("the second runner was asked %d times; notes.txt written: %v; updates %q", perms2.count(), fileExists(ws, "notes.txt"), rec2.texts())
		}
		if n := strings.Count(strings.Join(rec2.allLogs(), "\n"), "started the agent"); n != 0 {
			t.Fatal("the agent was started again")
		}
		closeAndExit(t, link2, p)
	})
}

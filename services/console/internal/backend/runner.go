package backend

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"time"

	runnerv1 "github.com/conclave-ai/conclave/proto/conclave/runner/v1"
)

// Runner is the runner's REST API (Kandev's paths, docs/runner.md).
type Runner struct{ *Client }

// AgentTypes lists the registry.
func (r Runner) AgentTypes(ctx context.Context, token string) ([]*runnerv1.AgentType, error) {
	var out runnerv1.ListAgentTypesResponse
	err := r.Do(ctx, token, "GET", "/api/v1/agent-types", nil, &out)
	return out.GetAgentTypes(), err
}

// Launch is what the console's launch form sends.
type Launch struct {
	TaskID        string            `json:"task_id,omitempty"`
	AgentType     string            `json:"agent_type"`
	WorkspacePath string            `json:"workspace_path"`
	Env           map[string]string `json:"env,omitempty"`
}

// Launch starts an instance and returns it with the trace id of the call.
func (r Runner) Launch(ctx context.Context, token string, l Launch) (*runnerv1.AgentInstance, string, error) {
	ctx, traceID := WithTrace(ctx)
	var in runnerv1.AgentInstance
	err := r.Do(ctx, token, "POST", "/api/v1/agents/launch", l, &in)
	return &in, traceID, err
}

// List is a page of the runner's instances, newest launch first (GET
// /api/v1/agents): size of them (0: the runner's default), after the page
// pageToken continues (empty: the first).
func (r Runner) List(ctx context.Context, token string, size int, pageToken string) (*runnerv1.ListAgentsResponse, error) {
	q := url.Values{}
	if size > 0 {
		q.Set("page_size", fmt.Sprint(size))
	}
	if pageToken != "" {
		q.Set("page_token", pageToken)
	}
	path := "/api/v1/agents"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out runnerv1.ListAgentsResponse
	err := r.Do(ctx, token, "GET", path, nil, &out)
	return &out, err
}

// Status is an instance's status and progress.
func (r Runner) Status(ctx context.Context, token, id string) (*runnerv1.AgentInstance, error) {
	var in runnerv1.AgentInstance
	err := r.Do(ctx, token, "GET", "/api/v1/agents/"+url.PathEscape(id)+"/status", nil, &in)
	return &in, err
}

// Prompt sends a turn to an instance.
func (r Runner) Prompt(ctx context.Context, token, id, message string) (string, error) {
	ctx, traceID := WithTrace(ctx)
	var out runnerv1.PromptAgentResponse
	err := r.Do(ctx, token, "POST", "/api/v1/agents/"+url.PathEscape(id)+"/prompt", map[string]string{"message": message}, &out)
	if err == nil && !out.GetAccepted() {
		err = &Error{Service: "runner", Kind: Rejected, Status: 200, Message: "the instance did not accept the prompt"}
	}
	return traceID, err
}

// Cancel ends an instance's current turn.
func (r Runner) Cancel(ctx context.Context, token, id, reason string) error {
	var out runnerv1.CancelAgentResponse
	return r.Do(ctx, token, "POST", "/api/v1/agents/"+url.PathEscape(id)+"/cancel", map[string]string{"reason": reason}, &out)
}

// LogLine is one line of an instance's logs.
type LogLine struct {
	Time   time.Time `json:"time"`
	Stream string    `json:"stream"`
	Text   string    `json:"text"`
}

// maxLogLine bounds one line of the follow stream.
const maxLogLine = 1 << 20

// FollowLogs calls onLine with the last tail lines and then each new one
// as it is written, until the instance's launch ends, the stream fails or
// ctx ends (GET /api/v1/agents/{id}/logs?follow=true, newline-delimited
// JSON).
func (r Runner) FollowLogs(ctx context.Context, token, id string, tail int, onLine func(LogLine)) error {
	body, err := r.Stream(ctx, token, "GET", fmt.Sprintf("/api/v1/agents/%s/logs?follow=true&tail=%d", url.PathEscape(id), tail), "application/json", nil)
	if err != nil {
		return err
	}
	defer body.Close()
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), maxLogLine)
	for sc.Scan() {
		var l struct {
			LogLine
			Error *struct {
				Error   string `json:"error"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return &Error{Service: "runner", Kind: Unavailable, Status: 200, Message: "a log line the console cannot read: " + err.Error(), Err: err}
		}
		if l.Error != nil {
			return &Error{Service: "runner", Kind: Rejected, Status: 200, Message: l.Error.Error + ": " + l.Error.Message}
		}
		onLine(l.LogLine)
	}
	if err := sc.Err(); err != nil && ctx.Err() == nil {
		return &Error{Service: "runner", Kind: Unavailable, Status: 200, Message: "the log stream broke: " + err.Error(), Err: err}
	}
	return nil
}

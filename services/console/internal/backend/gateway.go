package backend

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
)

var unmarshal = protojson.UnmarshalOptions{DiscardUnknown: true}

// decode reads a JSON answer: protobuf messages with protojson (the
// services' REST JSON), anything else with encoding/json.
func decode(data []byte, out any) error {
	if m, ok := out.(proto.Message); ok {
		return unmarshal.Unmarshal(data, m)
	}
	return json.Unmarshal(data, out)
}

// Gateway is the gateway's client API over REST.
type Gateway struct{ *Client }

// maxAgentPages bounds ListAgents: 10 pages of 100 agents.
const maxAgentPages = 10

// ListAgents lists every connected agent across the gateway's replicas.
func (g Gateway) ListAgents(ctx context.Context, token string) ([]*gatewayv1.Agent, error) {
	var agents []*gatewayv1.Agent
	pageToken := ""
	for range maxAgentPages {
		var page gatewayv1.ListAgentsResponse
		path := "/v1/agents?page_size=100"
		if pageToken != "" {
			path += "&page_token=" + url.QueryEscape(pageToken)
		}
		if err := g.Do(ctx, token, "GET", path, nil, &page); err != nil {
			return nil, err
		}
		agents = append(agents, page.GetAgents()...)
		if pageToken = page.GetNextPageToken(); pageToken == "" {
			break
		}
	}
	return agents, nil
}

// maxSSELine bounds one line of the gateway's event stream: an event may
// carry a file of up to a few MiB, base64-encoded.
const maxSSELine = 8 << 20

// SendMessage sends content to an agent and calls onEvent with each of
// its events as they arrive, until the reply ends, the stream fails or ctx
// ends. The gateway's stream is Server-Sent Events.
func (g Gateway) SendMessage(ctx context.Context, token string, req *gatewayv1.SendMessageRequest, onEvent func(*gatewayv1.SendMessageResponse)) error {
	body, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(req)
	if err != nil {
		return fmt.Errorf("encode message: %w", err)
	}
	stream, err := g.Stream(ctx, token, "POST", "/v1/agents/"+url.PathEscape(req.GetAgentId())+"/messages", "text/event-stream", json.RawMessage(body))
	if err != nil {
		return err
	}
	defer stream.Close()
	return readSSE(stream, func(event, data string) error {
		switch event {
		case "message", "":
			var m gatewayv1.SendMessageResponse
			if err := unmarshal.Unmarshal([]byte(data), &m); err != nil {
				return &Error{Service: "gateway", Kind: Unavailable, Status: 200, Message: "an event the console cannot read: " + err.Error(), Err: err}
			}
			onEvent(&m)
		case "end":
			return io.EOF
		case "error":
			var e struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}
			_ = json.Unmarshal([]byte(data), &e)
			if e.Message == "" {
				e.Message = data
			}
			return &Error{Service: "gateway", Kind: Rejected, Status: 200, Message: e.Message}
		}
		return nil
	})
}

// readSSE calls onEvent for each event of a text/event-stream body until
// the body ends or onEvent returns an error (io.EOF ends it cleanly).
func readSSE(r io.Reader, onEvent func(event, data string) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxSSELine)
	var event string
	var data []string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if len(data) > 0 || event != "" {
				if err := onEvent(event, strings.Join(data, "\n")); err != nil {
					if errors.Is(err, io.EOF) {
						return nil
					}
					return err
				}
			}
			event, data = "", nil
		case strings.HasPrefix(line, ":"):
			// a comment: keep-alive
		default:
			field, value, _ := strings.Cut(line, ":")
			value = strings.TrimPrefix(value, " ")
			switch field {
			case "event":
				event = value
			case "data":
				data = append(data, value)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return &Error{Service: "gateway", Kind: Unavailable, Status: 200, Message: "the stream broke: " + err.Error(), Err: err}
	}
	return nil
}

// Cancel asks the gateway to cancel a request in flight.
func (g Gateway) Cancel(ctx context.Context, token, requestID, reason string) (bool, error) {
	var out gatewayv1.CancelMessageResponse
	err := g.Do(ctx, token, "POST", "/v1/requests/"+url.PathEscape(requestID)+"/cancel", map[string]string{"reason": reason}, &out)
	return out.GetCancelled(), err
}

// threadsPage is how many of an agent's threads the console lists.
const threadsPage = 50

// ListThreads lists an agent's threads the token may read, newest first:
// the first threadsPage of them.
func (g Gateway) ListThreads(ctx context.Context, token, agentID string) ([]*gatewayv1.Thread, error) {
	var page gatewayv1.ListThreadsResponse
	path := fmt.Sprintf("/v1/agents/%s/threads?page_size=%d", url.PathEscape(agentID), threadsPage)
	if err := g.Do(ctx, token, "GET", path, nil, &page); err != nil {
		return nil, err
	}
	return page.GetThreads(), nil
}

// maxHistoryPages bounds History: 10 pages of 500 entries.
const maxHistoryPages = 10

// History reads a thread's entries, oldest first, up to maxHistoryPages
// pages; more reports that the thread has entries past them.
func (g Gateway) History(ctx context.Context, token, threadID string) (entries []*gatewayv1.ThreadEntry, more bool, err error) {
	pageToken := ""
	for range maxHistoryPages {
		var page gatewayv1.HistoryResponse
		path := "/v1/threads/" + url.PathEscape(threadID) + "/messages?page_size=500"
		if pageToken != "" {
			path += "&page_token=" + url.QueryEscape(pageToken)
		}
		if err := g.Do(ctx, token, "GET", path, nil, &page); err != nil {
			return nil, false, err
		}
		entries = append(entries, page.GetEntries()...)
		if pageToken = page.GetNextPageToken(); pageToken == "" {
			return entries, false, nil
		}
	}
	return entries, true, nil
}

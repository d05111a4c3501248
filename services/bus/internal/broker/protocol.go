// Package broker is the bus itself: sessions speaking the bub protocol
// over JSON-RPC 2.0, the ordered subscription table, fan-out with the three
// propagation policies, agent delivery with processMessage, durable retries
// and dead letters.
package broker

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/conclave-ai/conclave/pkg/jsonrpc"
	"github.com/conclave-ai/conclave/pkg/jsonscan"
)

// Error codes. The first four after the standard ones are the protocol's table;
// the rest are ours, in the range JSON-RPC reserves for server errors, and
// documented in docs/bus.md.
const (
	CodeNotInitialized       = -32000
	CodeAlreadyInitialized   = -32001
	CodeInvalidClientInfo    = -32002
	CodeAlreadySubscribed    = -32003
	CodeSubscriptionNotFound = -32004
	CodeForbidden            = -32005
	CodeTooManySubscriptions = -32006
	CodeRateLimited          = -32007
)

// Methods of the protocol.
const (
	MethodInitialize     = "initialize"
	MethodSubscribe      = "subscribe"
	MethodUnsubscribe    = "unsubscribe"
	MethodSendMessage    = "sendMessage"
	MethodProcessMessage = "processMessage"
	MethodPing           = "ping"
)

// Policy decides when a message stops propagating to further subscribers.
type Policy string

// The protocol's three policies.
const (
	StopOnProcessed Policy = "stopPropagationOnProcessed"
	StopOnStop      Policy = "stopPropagationOnStop"
	ContinueAll     Policy = "continueAll"
)

// ParsePolicy checks a policy name.
func ParsePolicy(s string) (Policy, error) {
	switch p := Policy(s); p {
	case StopOnProcessed, StopOnStop, ContinueAll:
		return p, nil
	}
	return "", fmt.Errorf("unknown policy %q (want %s, %s or %s)", s, StopOnProcessed, StopOnStop, ContinueAll)
}

// stops reports whether a subscriber's answer ends propagation under p.
// Base-protocol subscribers answer {success, stopPropagation}; only an
// explicit processed: true counts as processed, so that under the default
// policy they all still receive a broadcast, as the base protocol says.
func (p Policy) stops(processed, stop bool) bool {
	switch p {
	case StopOnProcessed:
		return processed || stop
	case StopOnStop:
		return stop
	}
	return false
}

func rpcError(code int, format string, args ...any) *jsonrpc.Error {
	return jsonrpc.NewError(code, fmt.Sprintf(format, args...))
}

func invalidParams(format string, args ...any) *jsonrpc.Error {
	return rpcError(jsonrpc.InvalidParams, "Invalid params: "+format, args...)
}

// ServerInfo names the server in the initialize result.
type ServerInfo struct {
	Name    string `json:"name"`
	Version string `json:"version"`
}

// InitializeResult is the protocol's initialize result, with the extensions
// this bus adds (processMessage, defaultTopic).
type InitializeResult struct {
	ServerID     string       `json:"serverId"`
	ServerInfo   ServerInfo   `json:"serverInfo"`
	Capabilities Capabilities `json:"capabilities"`
}

// Capabilities tells a client what the bus offers.
type Capabilities struct {
	Subscribe      bool     `json:"subscribe"`
	Publish        bool     `json:"publish"`
	Topics         []string `json:"topics"`
	ProcessMessage bool     `json:"processMessage"`
	DefaultTopic   string   `json:"defaultTopic,omitempty"`
}

// Ack is one subscriber's acknowledgement in a sendMessage result.
type Ack struct {
	ClientID  string `json:"client_id"`
	Processed bool   `json:"processed"`
	Message   string `json:"message,omitempty"`
}

// SendResult is what a publisher's sendMessage returns.
type SendResult struct {
	// Success: the message was routed to at least one subscriber (or taken
	// by the default handler).
	Success bool `json:"success"`
	// StopPropagation: a subscriber stopped propagation before every
	// matching subscriber was reached.
	StopPropagation bool  `json:"stopPropagation"`
	Acks            []Ack `json:"acks"`
}

// subscriberAnswer is what a subscriber returns to sendMessage (base
// protocol) or processMessage (extended). Every field is optional.
type subscriberAnswer struct {
	Success         *bool   `json:"success"`
	Processed       *bool   `json:"processed"`
	StopPropagation bool    `json:"stopPropagation"`
	ShouldRetry     bool    `json:"should_retry"`
	RetrySeconds    float64 `json:"retry_seconds"`
	Message         string  `json:"message"`
}

// decodeAnswer reads a subscriber's answer as json.Unmarshal into a
// subscriberAnswer does. It runs once per delivery, so the answer's
// members are walked instead (the answer is valid JSON: its frame was
// checked); anything but plain ASCII names and values of the expected
// kinds is left to encoding/json, with its errors.
func decodeAnswer(answer []byte, ans *subscriberAnswer) error {
	if fastAnswer(answer, ans) {
		return nil
	}
	*ans = subscriberAnswer{}
	return json.Unmarshal(answer, ans)
}

// The values an answer's optional booleans point to: shared, as
// subscriberAnswer is only read, so reading one does not allocate.
var answerTrue, answerFalse = true, false

func fastAnswer(b []byte, ans *subscriberAnswer) bool {
	ok := true
	err := jsonscan.EachMember(b, func(key, val []byte) bool {
		for _, c := range key {
			if c == '\\' || c >= utf8.RuneSelf {
				ok = false
				return false
			}
		}
		switch {
		case bytes.EqualFold(key, []byte("success")):
			ok = optBool(&ans.Success, val)
		case bytes.EqualFold(key, []byte("processed")):
			ok = optBool(&ans.Processed, val)
		case bytes.EqualFold(key, []byte("stopPropagation")):
			ok = plainBool(&ans.StopPropagation, val)
		case bytes.EqualFold(key, []byte("should_retry")):
			ok = plainBool(&ans.ShouldRetry, val)
		case bytes.EqualFold(key, []byte("retry_seconds")):
			switch {
			case string(val) == "null":
			case val[0] == '-' || (val[0] >= '0' && val[0] <= '9'):
				f, err := strconv.ParseFloat(string(val), 64)
				ans.RetrySeconds, ok = f, err == nil
			default:
				ok = false
			}
		case bytes.EqualFold(key, []byte("message")):
			switch {
			case string(val) == "null":
			case val[0] == '"' && bytes.IndexByte(val, '\\') < 0 && utf8.Valid(val):
				ans.Message = string(val[1 : len(val)-1])
			default:
				ok = false
			}
		}
		return ok
	})
	return err == nil && ok
}

func optBool(p **bool, val []byte) bool {
	switch string(val) {
	case "true":
		*p = &answerTrue
	case "false":
		*p = &answerFalse
	case "null":
		*p = nil
	default:
		return false
	}
	return true
}

func plainBool(p *bool, val []byte) bool {
	switch string(val) {
	case "true":
		*p = true
	case "false":
		*p = false
	case "null":
	default:
		return false
	}
	return true
}

// deliveryParams encodes a delivery's params: the protocol's {topic,
// payload}, and the same topic as to, with from and messageId, as current
// bub clients read a message. The payload is already JSON, so the object is
// put together by hand.
func deliveryParams(msg *message) json.RawMessage {
	return append(deliveryMembers(msg, 1), '}')
}

// deliveryMembers encodes deliveryParams without its closing brace, in a
// buffer with room for extra more bytes.
func deliveryMembers(msg *message, extra int) []byte {
	head, _ := json.Marshal(struct { // strings only: Marshal cannot fail
		Topic     string `json:"topic"`
		To        string `json:"to"`
		From      string `json:"from,omitempty"`
		MessageID string `json:"messageId"`
	}{msg.topic, msg.topic, msg.from(), msg.messageID()})
	out := make([]byte, 0, len(head)+len(msg.payload)+11+extra)
	out = append(out, head[:len(head)-1]...) // without its closing brace
	out = append(out, `,"payload":`...)
	return append(out, msg.payload...)
}

// payloadType returns the payload's string "type" member, or "" when the
// payload has none (or it is not a string). The payload is valid JSON
// (a request's params, checked when read); its type is read as
// encoding/json would read
// it into a struct: the last member whose name folds to "type" counts. It
// runs on every publish, so a payload's members are walked without
// decoding them; a name with escapes or other than ASCII, rare, is left
// to encoding/json.
func payloadType(payload json.RawMessage) string {
	var typ []byte
	slow := false
	err := jsonscan.EachMember(payload, func(key, val []byte) bool {
		for _, c := range key {
			if c == '\\' || c >= utf8.RuneSelf {
				slow = true
				return false
			}
		}
		if bytes.EqualFold(key, []byte("type")) {
			typ = val
		}
		return true
	})
	if slow {
		return payloadTypeDecoded(payload)
	}
	if err != nil || len(typ) < 2 || typ[0] != '"' {
		return ""
	}
	if utf8.Valid(typ) {
		return jsonscan.String(typ)
	}
	var t string // encoding/json reads invalid UTF-8 as U+FFFD
	if json.Unmarshal(typ, &t) != nil {
		return ""
	}
	return t
}

// payloadTypeDecoded is payloadType through encoding/json.
func payloadTypeDecoded(payload json.RawMessage) string {
	var typed struct {
		Type json.RawMessage `json:"type"`
	}
	if json.Unmarshal(payload, &typed) != nil || len(typed.Type) == 0 {
		return ""
	}
	var s string
	if json.Unmarshal(typed.Type, &s) != nil {
		return ""
	}
	return s
}

package broker

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"testing"

	"github.com/conclave-ai/conclave/pkg/jsonrpc"
	"github.com/conclave-ai/conclave/pkg/queue"
)

// FuzzHandle feeds arbitrary params to every method of a session, before
// and after initialize: each call must return a result or a JSON-RPC error
// with one of the protocol's codes, never panic.
func FuzzHandle(f *testing.F) {
	for _, seed := range []string{
		`{"clientId":"agent-1","clientInfo":{"name":"bub","version":"0.2.0"}}`,
		`{"topic":"inbound:chat-*"}`, `{"topic":"inbound:*","policy":"continueAll"}`,
		`{"topic":"inbound:chat-1","payload":{"chat_id":"chat-1","text":"hello"}}`,
		`{"payload":{"type":"x"}}`, `{}`, `[]`, `null`, `{"topic":1}`, `{"clientId":"\u0000"}`,
		`{"topic":"` + string(make([]byte, 300)) + `"}`, `{"capabilities":[],"clientId":"a"}`,
		`{"address":"tg:*"}`, `{"topic":"a:1","to":"a:2"}`, `{"messageId":"","from":1}`,
		`{"from":"tg:1","to":"agent:x","messageId":"msg_01J","payload":{"type":"t"}}`,
	} {
		for m := range 6 {
			f.Add(uint8(m), []byte(seed))
		}
	}
	methods := []string{MethodInitialize, MethodSubscribe, MethodUnsubscribe, MethodSendMessage, MethodPing, "other"}
	codes := map[int]bool{
		jsonrpc.InvalidParams: true, jsonrpc.MethodNotFound: true, CodeNotInitialized: true,
		CodeAlreadyInitialized: true, CodeInvalidClientInfo: true, CodeAlreadySubscribed: true,
		CodeSubscriptionNotFound: true, CodeForbidden: true, CodeTooManySubscriptions: true, CodeRateLimited: true,
	}
	f.Fuzz(func(t *testing.T, method uint8, params []byte) {
		if !json.Valid(params) {
			return // the framing layer answers those with -32700 before any handler
		}
		b := New(Options{Logger: slog.New(slog.DiscardHandler), Rate: 1e9, Burst: 1e9})
		s := b.NewSession(SessionAuth{Open: true})
		ctx := context.Background()
		call := func(m string, p []byte) {
			_, err := s.Handle(ctx, &jsonrpc.Request{ID: jsonrpc.Int64ID(1), Method: m, Params: p})
			if err == nil {
				return
			}
			var rpcErr *jsonrpc.Error
			if !errors.As(err, &rpcErr) || !codes[rpcErr.Code] {
				t.Fatalf("%s %s: error %v is not one of the protocol's", m, p, err)
			}
		}
		m := methods[int(method)%len(methods)]
		call(m, params)
		call(MethodInitialize, []byte(`{"clientId":"fuzz"}`))
		call(m, params)
		call(MethodSubscribe, params)
		call(MethodSendMessage, params)
		call(MethodUnsubscribe, params)
	})
}

// FuzzDecodeEnvelope feeds arbitrary queue bodies to the events decoder: it
// returns an envelope or an error, and a decoded envelope always has a
// topic.
func FuzzDecodeEnvelope(f *testing.F) {
	f.Add([]byte("CgRldi0xEhpydW5uZXIudGFzay5zdGF0dXNfY2hhbmdlZA=="))
	f.Add([]byte("not base64"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, body []byte) {
		env, err := queue.DecodeEnvelope(body)
		if err != nil {
			return
		}
		if EventTopic(env) == "" {
			t.Fatalf("envelope %v has no topic", env)
		}
	})
}

// FuzzPayloadType checks that the payload's type read by walking its
// members is what encoding/json reads, for every valid payload.
func FuzzPayloadType(f *testing.F) {
	for _, seed := range []string{
		`{"type":"task_request","task_id":"t"}`, `{"type":1}`, `{"type":null}`, `{"Type":"a","type":"b"}`,
		`{"type":"a","TYPE":"b"}`, `{"\u0074ype":"esc"}`, `{"ſype":"s"}`, `{"type":"a\"b\u00e9"}`, `{}`, `[]`,
		`"x"`, `null`, `{"a":{"type":"nested"}}`, ` { "type" : "spaced" } `, `{"typ":"x","types":"y"}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		if !json.Valid(payload) {
			return // payloads are checked when read
		}
		if got, want := payloadType(payload), payloadTypeDecoded(payload); got != want {
			t.Errorf("payloadType(%s) = %q, encoding/json reads %q", payload, got, want)
		}
	})
}

// FuzzDecodeAnswer checks that a subscriber's answer read by walking its
// members is what encoding/json reads, error or not, for every valid
// answer.
func FuzzDecodeAnswer(f *testing.F) {
	for _, seed := range []string{
		`{"success":true}`, `{"processed":false,"message":"m"}`, `{"processed":true,"stopPropagation":true}`,
		`{"should_retry":true,"retry_seconds":1.5,"message":"later"}`, `{"Success":true,"success":false}`,
		`{"success":null}`, `{"success":1}`, `{"retry_seconds":"1"}`, `{"retry_seconds":1e400}`,
		`{"message":"a\"b"}`, `{"message":"\u00e9"}`, `{"message":"é"}`, `{"messaGe":null}`, `{"x":[1,{"success":true}]}`,
		`{}`, `null`, `[]`, `true`, `{"\u0073uccess":true}`, ` { "success" : true } `, `{"stopPropagation":"yes"}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, answer []byte) {
		if !json.Valid(answer) {
			return // answers come in frames already checked
		}
		var got, want subscriberAnswer
		gotErr, wantErr := decodeAnswer(answer, &got), json.Unmarshal(answer, &want)
		if (gotErr == nil) != (wantErr == nil) {
			t.Fatalf("decodeAnswer(%s): error %v, encoding/json %v", answer, gotErr, wantErr)
		}
		if gotErr == nil && !sameAnswer(got, want) {
			t.Errorf("decodeAnswer(%s) = %+v, encoding/json reads %+v", answer, got, want)
		}
	})
}

func sameAnswer(a, b subscriberAnswer) bool {
	sameOpt := func(x, y *bool) bool { return (x == nil) == (y == nil) && (x == nil || *x == *y) }
	return sameOpt(a.Success, b.Success) && sameOpt(a.Processed, b.Processed) &&
		a.StopPropagation == b.StopPropagation && a.ShouldRetry == b.ShouldRetry &&
		a.RetrySeconds == b.RetrySeconds && a.Message == b.Message
}

// FuzzObjectParams checks that params walked into their members are what
// encoding/json decodes into the map, error or not, for all valid params.
func FuzzObjectParams(f *testing.F) {
	for _, seed := range []string{
		`{"topic":"a:1","payload":{"type":"t"}}`, `{"a":1,"a":2}`, `{"\u0074opic":"esc"}`, `{"é":1}`,
		`{"x":null}`, `{}`, `null`, `[]`, `1`, ` { "a" : [ 1 , 2 ] } `, `{"a":"\u00e9\"}"}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, params []byte) {
		if !json.Valid(params) {
			return // frames are checked before their params are read
		}
		got, gotErr := objectParams(&jsonrpc.Request{Params: params})
		want := map[string]json.RawMessage{}
		wantErr := json.Unmarshal(params, &want)
		if wantErr == nil && want == nil {
			wantErr = errors.New("null")
		}
		if (gotErr == nil) != (wantErr == nil) {
			t.Fatalf("objectParams(%s): error %v, encoding/json %v", params, gotErr, wantErr)
		}
		if gotErr != nil {
			return
		}
		if len(got) != len(want) {
			t.Fatalf("objectParams(%s) = %d members, encoding/json %d", params, len(got), len(want))
		}
		for k, v := range want {
			if string(got[k]) != string(v) {
				t.Errorf("objectParams(%s)[%q] = %s, encoding/json %s", params, k, got[k], v)
			}
		}
	})
}

// FuzzStringMember: a member read without json.Unmarshal reads as it
// would with it, and is refused as it would be.
func FuzzStringMember(f *testing.F) {
	for _, seed := range []string{`"plain"`, `""`, `"tab\tescaped"`, `"\u00e9t\u00e9"`, `"é"`, "\"\xff\"", `"a\"b"`, `1`, `null`, `{"a":"b"}`, `["x"]`, `true`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if !json.Valid(raw) {
			return // params reach the handlers only once jsonrpc checked them
		}
		got, present, err := stringMember(map[string]json.RawMessage{"m": raw}, "m")
		var want string
		werr := json.Unmarshal(raw, &want)
		switch {
		case string(raw) == "null":
			if present || err != nil {
				t.Fatalf("null: present %v, err %v", present, err)
			}
		case werr != nil:
			if err == nil {
				t.Fatalf("%q read as %q, json.Unmarshal refuses it: %v", raw, got, werr)
			}
		case err != nil || !present || got != want:
			t.Fatalf("%q read as %q (%v, %v), json.Unmarshal reads %q", raw, got, present, err, want)
		}
	})
}

package queue

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	eventsv1 "github.com/conclave-ai/conclave/proto/conclave/events/v1"
)

// Every event crossing a queue is a conclave.events.v1.Envelope, encoded
// the same way by every producer so that any consumer reads any producer's:
// protojson with the proto field names, which an operator can read in the
// SQS console. DecodeEnvelope also takes the protobuf binary encoding in
// base64, for producers that cannot link protojson.

// EncodeEnvelope is an envelope as it travels in a message body.
func EncodeEnvelope(env *eventsv1.Envelope) ([]byte, error) {
	return protojson.MarshalOptions{UseProtoNames: true}.Marshal(env)
}

// DecodeEnvelope reads a message body as an envelope; it must have an id
// (consumers deduplicate on it) and a type.
func DecodeEnvelope(body []byte) (*eventsv1.Envelope, error) {
	env := &eventsv1.Envelope{}
	if trimmed := bytes.TrimSpace(body); len(trimmed) > 0 && trimmed[0] == '{' {
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(trimmed, env); err != nil {
			return nil, fmt.Errorf("not an Envelope in protojson: %w", err)
		}
	} else {
		raw, err := base64.StdEncoding.DecodeString(string(body))
		if err != nil {
			return nil, errors.New("neither protojson nor base64")
		}
		if err := proto.Unmarshal(raw, env); err != nil {
			return nil, fmt.Errorf("not an Envelope: %w", err)
		}
	}
	if env.GetId() == "" || env.GetType() == "" {
		return nil, errors.New("envelope without id or type")
	}
	return env, nil
}

// DecodeEnvelopeJSON is DecodeEnvelope for a consumer that passes an
// envelope's payload on rather than reading it (the bus). It also returns
// the payload as JSON: as its producer encoded it (protojson with the
// proto field names, with its "@type"), or nil when the envelope has none.
// And it reads an envelope whose payload is of a type this binary does not
// link, which DecodeEnvelope refuses (protojson cannot decode an Any of an
// unknown type); the envelope's Payload is then nil, and the JSON is the
// consumer's only copy of it. From the base64 binary encoding, a payload of
// a type not linked is {"@type", "value": base64 of its bytes}.
func DecodeEnvelopeJSON(body []byte) (*eventsv1.Envelope, json.RawMessage, error) {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		env, err := DecodeEnvelope(body)
		if err != nil {
			return nil, nil, err
		}
		return env, payloadJSON(env.GetPayload()), nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(trimmed, &fields); err != nil {
		return nil, nil, fmt.Errorf("not an Envelope in protojson: %w", err)
	}
	payload := fields["payload"]
	delete(fields, "payload")
	rest, err := json.Marshal(fields)
	if err != nil {
		return nil, nil, err
	}
	env, err := DecodeEnvelope(rest)
	if err != nil {
		return nil, nil, err
	}
	if len(payload) == 0 || string(payload) == "null" {
		return env, nil, nil
	}
	var typed struct {
		Type string `json:"@type"`
	}
	if json.Unmarshal(payload, &typed) != nil || typed.Type == "" {
		return nil, nil, errors.New("not an Envelope in protojson: its payload is not an Any (a JSON object with an @type)")
	}
	a := &anypb.Any{}
	if (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(payload, a) == nil {
		env.Payload = a
	}
	return env, payload, nil
}

// payloadJSON is an envelope's payload as protojson with the proto field
// names, or {"@type", "value"} when its type is not linked.
func payloadJSON(a *anypb.Any) json.RawMessage {
	if a == nil {
		return nil
	}
	if data, err := (protojson.MarshalOptions{UseProtoNames: true}).Marshal(a); err == nil {
		return data
	}
	data, _ := json.Marshal(map[string]string{"@type": a.GetTypeUrl(), "value": base64.StdEncoding.EncodeToString(a.GetValue())})
	return data
}

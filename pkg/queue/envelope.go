package queue

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

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

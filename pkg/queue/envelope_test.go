package queue

import (
	"encoding/base64"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventsv1 "github.com/conclave-ai/conclave/proto/conclave/events/v1"
)

func TestEnvelopeRoundTrip(t *testing.T) {
	t.Parallel()
	env := &eventsv1.Envelope{Id: "e1", Type: "librarian.approved", Source: "librarian", Time: timestamppb.Now(),
		SubjectIds: map[string]string{"request_id": "r1"}}
	body, err := EncodeEnvelope(env)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(body), `"subject_ids"`) {
		t.Errorf("body is not protojson with proto names: %s", body)
	}
	got, err := DecodeEnvelope(body)
	if err != nil || !proto.Equal(got, env) {
		t.Fatalf("round trip: %v %v", got, err)
	}
	raw, _ := proto.Marshal(env)
	if got, err := DecodeEnvelope([]byte(base64.StdEncoding.EncodeToString(raw))); err != nil || !proto.Equal(got, env) {
		t.Fatalf("base64 binary: %v %v", got, err)
	}
}

// TestDecodeEnvelopeJSONOfAnUnlinkedType: a consumer that does not link
// an envelope's payload type (the standalone bus, given the Librarian's
// events) still reads the envelope, and passes the payload on as its
// producer encoded it; a linked payload is decoded too (found by the
// end-to-end scenario: the bus dropped every Librarian event).
func TestDecodeEnvelopeJSONOfAnUnlinkedType(t *testing.T) {
	t.Parallel()
	payload := `{"@type":"type.googleapis.com/conclave.unlinked.v1.Thing","request_id":"r1","nested":{"a":[1,2]}}`
	body := `{"id":"e1","type":"librarian.request.approved","source":"librarian","subject_ids":{"request_id":"r1"},` +
		`"trace_context":{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},"payload":` + payload + `}`
	if _, err := DecodeEnvelope([]byte(body)); err == nil {
		t.Fatal("DecodeEnvelope decoded an Any of a type it does not link; the test needs one it cannot")
	}
	env, got, err := DecodeEnvelopeJSON([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if env.GetId() != "e1" || env.GetSubjectIds()["request_id"] != "r1" || env.GetTraceContext().GetTraceparent() == "" || env.GetPayload() != nil {
		t.Errorf("envelope %v", env)
	}
	if string(got) != payload {
		t.Errorf("payload %s, want the producer's %s", got, payload)
	}

	// A linked type: decoded, and passed on as it came.
	status, err := anypb.New(timestamppb.Now())
	if err != nil {
		t.Fatal(err)
	}
	linked := &eventsv1.Envelope{Id: "e2", Type: "runner.task.status_changed", Payload: status}
	enc, err := EncodeEnvelope(linked)
	if err != nil {
		t.Fatal(err)
	}
	env, got, err = DecodeEnvelopeJSON(enc)
	if err != nil || !proto.Equal(env, linked) || !strings.Contains(string(got), `"@type":"type.googleapis.com/google.protobuf.Timestamp"`) {
		t.Fatalf("linked: %v %s %v", env, got, err)
	}
	// The binary encoding: the payload re-encoded.
	raw, _ := proto.Marshal(linked)
	if env, got, err := DecodeEnvelopeJSON([]byte(base64.StdEncoding.EncodeToString(raw))); err != nil || !proto.Equal(env, linked) || len(got) == 0 {
		t.Fatalf("base64: %v %s %v", env, got, err)
	}
	for name, body := range map[string]string{
		"payload not an object": `{"id":"e","type":"t","payload":"x"}`,
		"payload without @type": `{"id":"e","type":"t","payload":{"a":1}}`,
		"no id":                 `{"type":"t","payload":{"@type":"x"}}`,
	} {
		if _, _, err := DecodeEnvelopeJSON([]byte(body)); err == nil {
			t.Errorf("%s: decoded %s", name, body)
		}
	}
}

func TestDecodeEnvelopeRefuses(t *testing.T) {
	t.Parallel()
	for name, body := range map[string]string{
		"empty":        "",
		"not json":     "{nope",
		"no id":        `{"type":"x"}`,
		"no type":      `{"id":"x"}`,
		"not base64":   "%%%",
		"not envelope": base64.StdEncoding.EncodeToString([]byte{0xff, 0xff}),
	} {
		if _, err := DecodeEnvelope([]byte(body)); err == nil {
			t.Errorf("%s: decoded %q", name, body)
		}
	}
}

func FuzzDecodeEnvelope(f *testing.F) {
	f.Add([]byte(`{"id":"a","type":"b"}`))
	f.Add([]byte("CgFhEgFi"))
	f.Fuzz(func(t *testing.T, body []byte) {
		env, err := DecodeEnvelope(body)
		if err == nil && (env.GetId() == "" || env.GetType() == "") {
			t.Fatalf("accepted an envelope without id or type: %q", body)
		}
	})
}

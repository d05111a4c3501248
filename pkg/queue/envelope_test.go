package queue

import (
	"encoding/base64"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
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

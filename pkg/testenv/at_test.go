package testenv

import (
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

func TestAt(t *testing.T) {
	t.Parallel()
	var doc any
	if err := json.Unmarshal([]byte(`{"result":{"acks":[{"client_id":"a","processed":true}],"n":2}}`), &doc); err != nil {
		t.Fatal(err)
	}
	if got := At[string](t, doc, "result", "acks", 0, "client_id"); got != "a" {
		t.Errorf("client_id = %q", got)
	}
	if got := At[[]any](t, doc, "result", "acks"); len(got) != 1 {
		t.Errorf("acks = %v", got)
	}
	if got := At[float64](t, doc, "result", "n"); got != 2 {
		t.Errorf("n = %v", got)
	}
	for _, tt := range []struct {
		name string
		get  func(t testing.TB)
		want string
	}{
		{"missing member", func(t testing.TB) { At[any](t, doc, "result", "nacks") }, `$.result.nacks: no member "nacks"`},
		{"index past the end", func(t testing.TB) { At[any](t, doc, "result", "acks", 1) }, "$.result.acks[1]: no element 1 of 1"},
		{"wrong type", func(t testing.TB) { At[string](t, doc, "result", "n") }, "$.result.n: float64 (2), want a string"},
		{"not an object", func(t testing.TB) { At[any](t, doc, "result", "n", "x") }, "$.result.n.x: float64, not an object"},
		{"not an array", func(t testing.TB) { At[any](t, doc, "result", 0) }, "$.result[0]: map[string]interface {}, not an array"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := &recorder{TB: t}
			tt.get(r)
			if !strings.Contains(r.failed, tt.want) {
				t.Fatalf("failure %q, want it to say %q", r.failed, tt.want)
			}
		})
	}
}

func TestAs(t *testing.T) {
	t.Parallel()
	if got := As[string](t, any("a"), "the name"); got != "a" {
		t.Errorf("As = %q", got)
	}
	if got := As[fmt.Stringer](t, any(time.Second), "the duration"); got.String() != "1s" {
		t.Errorf("As = %v", got)
	}
	for _, tt := range []struct {
		name string
		get  func(t testing.TB)
		want string
	}{
		{"another type", func(t testing.TB) { As[string](t, any(2), "the count") }, "the count: got int (2), want a string"},
		{"nil", func(t testing.TB) { As[*net.TCPAddr](t, nil, "the address") }, "the address: got <nil> (<nil>), want a *net.TCPAddr"},
		{"not the interface", func(t testing.TB) { As[fmt.Stringer](t, any(3), "the value") }, "the value: got int (3), want a fmt.Stringer"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := &recorder{TB: t}
			tt.get(r)
			if !strings.Contains(r.failed, tt.want) {
				t.Fatalf("failure %q, want it to say %q", r.failed, tt.want)
			}
		})
	}
}

package jsonscan_test

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/conclave-ai/conclave/pkg/jsonscan"
)

func TestEachMember(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want map[string]string
		err  bool
	}{
		{in: `{}`, want: map[string]string{}},
		{in: ` { "a" : 1 , "b":"x\"y", "c":{"d":[1,{"e":"}"}]} } `, want: map[string]string{"a": `1`, "b": `"x\"y"`, "c": `{"d":[1,{"e":"}"}]}`}},
		{in: `{"a":[1,2],"b":null,"c":true}`, want: map[string]string{"a": `[1,2]`, "b": `null`, "c": `true`}},
		{in: `[]`, err: true},
		{in: `{"a"}`, err: true},
		{in: `{"a":1`, err: true},
		{in: `{"a":"unterminated}`, err: true},
		{in: `{"a":{"b":1}`, err: true},
		{in: `{a:1}`, err: true},
		{in: ``, err: true},
	} {
		got := map[string]string{}
		err := jsonscan.EachMember([]byte(tc.in), func(k, v []byte) bool {
			got[string(k)] = string(v)
			return true
		})
		if tc.err {
			if err == nil {
				t.Errorf("%s: no error", tc.in)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: %v %v, want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestEachElemAndString(t *testing.T) {
	t.Parallel()
	var got []string
	if err := jsonscan.EachElem([]byte(` [ "a\u00e9" , "b", 3 ] `), func(v []byte) { got = append(got, jsonscan.String(v)) }); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, []string{"aé", "b", ""}) {
		t.Fatalf("elements %q", got)
	}
	if err := jsonscan.EachElem([]byte(`[1,`), func([]byte) {}); err == nil {
		t.Fatal("no error for a truncated array")
	}
}

// FuzzEachMember: any input gives an error or members, never a panic; for a
// valid JSON object the members are the ones encoding/json reads.
func FuzzEachMember(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":1}`, `{"a":{"b":[1,"]"]},"c":"\\"}`, `{"a":`, `[1]`, `{"\u0061":2}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got := map[string]json.RawMessage{}
		err := jsonscan.EachMember(b, func(k, v []byte) bool {
			got[jsonscan.String(append(append([]byte{'"'}, k...), '"'))] = json.RawMessage(v)
			return true
		})
		var want map[string]json.RawMessage
		if json.Unmarshal(b, &want) != nil || want == nil {
			return
		}
		if err != nil {
			t.Fatalf("valid object %q: %v", b, err)
		}
		if len(got) != len(want) {
			t.Fatalf("valid object %q: members %v, want %v", b, got, want)
		}
	})
}

package testenv

import (
	"strings"
	"testing"
	"time"
)

func TestDecodeProtocol(t *testing.T) {
	t.Parallel()
	type item struct {
		Name string `json:"name"`
	}
	type doc struct {
		ID       string         `json:"id"`
		Count    int            `json:"count"`
		Ratio    float64        `json:"ratio"`
		OK       bool           `json:"ok"`
		At       time.Time      `json:"at"`
		Items    []item         `json:"items"`
		Tags     []string       `json:"tags"`
		Extra    map[string]any `json:"extra"`
		Note     *string        `json:"note"`
		Minutes  *int           `json:"minutes"`
		Anything any            `json:"anything"`
	}
	const good = `{"id":"a","count":16,"ratio":0.5,"ok":true,"at":"2025-01-02T03:04:05Z","items":[{"name":"x"}],"tags":[],"extra":{"k":1},"anything":null`
	tests := []struct {
		name, json string
		want       []string // in the error; none: no error
	}{
		{"every field", good + `,"note":"n","minutes":5}`, nil},
		{"optional fields absent", good + `}`, nil},
		{"optional fields null", good + `,"note":null,"minutes":null}`, nil},
		{"a number as a string", strings.Replace(good, `"count":16`, `"count":"16"`, 1) + `}`, []string{"count"}},
		{"an optional number as a string", good + `,"minutes":"5"}`, []string{"minutes"}},
		{"a list left out", strings.Replace(good, `"tags":[],`, ``, 1) + `}`, []string{"$.tags is missing"}},
		{"a list as null", strings.Replace(good, `"tags":[]`, `"tags":null`, 1) + `}`, []string{"$.tags is null, want an array"}},
		{"a member of an item", strings.Replace(good, `[{"name":"x"}]`, `[{}]`, 1) + `}`, []string{"$.items[0].name is missing"}},
		{"an unknown member", good + `,"surprise":1}`, []string{"surprise"}},
		{"an object as null", strings.Replace(good, `{"k":1}`, `null`, 1) + `}`, []string{"$.extra is null, want an object"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var d doc
			err := DecodeProtocol([]byte(tt.json), &d)
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error for %s", tt.json)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

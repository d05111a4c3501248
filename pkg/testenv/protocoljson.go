package testenv

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
)

// DecodeProtocol decodes raw, a JSON document a service answered, into v, a
// pointer to a struct written from a protocol's text rather than from the
// service's own types, and checks that the document holds what the
// protocol says, as a client written from that text would read it:
//
//   - no member that v does not name (json.Decoder.DisallowUnknownFields);
//   - every member of a non-pointer field present and not null: a list the
//     protocol gives is [] when empty, never left out;
//   - each member of the JSON type its field's Go type stands for: string
//     (and time.Time, and any encoding.TextUnmarshaler) a string, bool a
//     boolean, integers and floats a number, a slice an array, a map or a
//     struct an object, any anything;
//   - a pointer field is optional: its member may be absent or null.
//
// It reports every mismatch, each with its JSON path.
func DecodeProtocol(raw []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("decoding %s: %w", raw, err)
	}
	var doc any
	dec = json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		return err
	}
	var errs []error
	checkShape(reflect.TypeOf(v).Elem(), doc, "$", &errs)
	if len(errs) > 0 {
		return fmt.Errorf("%s: %w", raw, errors.Join(errs...))
	}
	return nil
}

var textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()

// checkShape checks that v, a decoded JSON value, has the JSON type t
// stands for.
func checkShape(t reflect.Type, v any, path string, errs *[]error) {
	bad := func(want string) {
		*errs = append(*errs, fmt.Errorf("%s is %s, want %s", path, jsonType(v), want))
	}
	if t.Kind() == reflect.Pointer {
		if v == nil {
			return
		}
		t = t.Elem()
	}
	if t.Kind() == reflect.Interface {
		return
	}
	if reflect.PointerTo(t).Implements(textUnmarshaler) || t.Kind() == reflect.String ||
		(t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Uint8) {
		if _, ok := v.(string); !ok {
			bad("a string")
		}
		return
	}
	switch t.Kind() {
	case reflect.Bool:
		if _, ok := v.(bool); !ok {
			bad("a boolean")
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
		reflect.Float32, reflect.Float64:
		if _, ok := v.(json.Number); !ok {
			bad("a number")
		}
	case reflect.Slice, reflect.Array:
		items, ok := v.([]any)
		if !ok {
			bad("an array")
			return
		}
		for i, item := range items {
			checkShape(t.Elem(), item, fmt.Sprintf("%s[%d]", path, i), errs)
		}
	case reflect.Map:
		obj, ok := v.(map[string]any)
		if !ok {
			bad("an object")
			return
		}
		for k, item := range obj {
			checkShape(t.Elem(), item, path+"."+k, errs)
		}
	case reflect.Struct:
		obj, ok := v.(map[string]any)
		if !ok {
			bad("an object")
			return
		}
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if !f.IsExported() || name == "-" {
				continue
			}
			if name == "" {
				name = f.Name
			}
			member, present := obj[name]
			switch {
			case !present && f.Type.Kind() != reflect.Pointer:
				*errs = append(*errs, fmt.Errorf("%s.%s is missing", path, name))
			case present:
				checkShape(f.Type, member, path+"."+name, errs)
			}
		}
	default:
		*errs = append(*errs, fmt.Errorf("%s: DecodeProtocol cannot check a Go %s", path, t))
	}
}

func jsonType(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case string:
		return fmt.Sprintf("the string %q", v)
	case bool:
		return "a boolean"
	case json.Number:
		return "a number"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}

package api

import (
	"bytes"
	"encoding/json"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// marshal renders the API's messages with the JSON types the Librarian's
// protocol states, for clients written from it rather than from our protos.
var marshal protocolJSON

// protocolJSON is protojson with the protocol's field names, and:
//
//   - every field present: lists as [] when empty, numbers as 0, strings
//     as "", messages as null. The protocol's Optional fields (proto3
//     optional) stay absent when unset, which Optional allows.
//   - 64-bit integers (processing_time_ms, max_request_size_bytes) as JSON
//     numbers, where protojson writes strings: the protocol's type is int.
//     Their values stay far below 2^53, where a JSON number loses
//     precision in JavaScript.
type protocolJSON struct{}

var everyField = protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}

func (protocolJSON) Marshal(m proto.Message) ([]byte, error) {
	b, err := everyField.Marshal(m)
	if err != nil {
		return nil, err
	}
	md := m.ProtoReflect().Descriptor()
	if !has64BitInts(md, map[protoreflect.FullName]bool{}) {
		return b, nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber() // numbers keep their text
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	numbers64(md, v)
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false) // as protojson writes strings
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(out.Bytes(), []byte("\n")), nil
}

// wellKnown reports whether md is a google.protobuf type, whose JSON form
// is its own (a Struct is any object): its contents are left as they are.
func wellKnown(md protoreflect.MessageDescriptor) bool {
	return strings.HasPrefix(string(md.FullName()), "google.protobuf.")
}

func is64Bit(k protoreflect.Kind) bool {
	switch k {
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind,
		protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return true
	}
	return false
}

// has64BitInts reports whether a message of type md can hold a 64-bit
// integer field; seen guards against recursive types.
func has64BitInts(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]bool) bool {
	if wellKnown(md) || seen[md.FullName()] {
		return false
	}
	seen[md.FullName()] = true
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.IsMap() {
			fd = fd.MapValue()
		}
		if is64Bit(fd.Kind()) || (fd.Message() != nil && has64BitInts(fd.Message(), seen)) {
			return true
		}
	}
	return false
}

// numbers64 turns the 64-bit integers in v, a message of type md as
// protojson wrote it, from strings into numbers.
func numbers64(md protoreflect.MessageDescriptor, v any) {
	obj, ok := v.(map[string]any)
	if !ok || wellKnown(md) {
		return
	}
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		val, ok := obj[string(fd.Name())]
		if !ok {
			continue
		}
		switch {
		case fd.IsMap():
			if entries, ok := val.(map[string]any); ok {
				for k, e := range entries {
					entries[k] = number64(fd.MapValue(), e)
				}
			}
		case fd.IsList():
			if items, ok := val.([]any); ok {
				for j, e := range items {
					items[j] = number64(fd, e)
				}
			}
		default:
			obj[string(fd.Name())] = number64(fd, val)
		}
	}
}

// number64 is one value of field fd with its 64-bit integers as numbers.
func number64(fd protoreflect.FieldDescriptor, v any) any {
	if is64Bit(fd.Kind()) {
		if s, ok := v.(string); ok {
			return json.Number(s)
		}
		return v
	}
	if fd.Message() != nil {
		numbers64(fd.Message(), v)
	}
	return v
}

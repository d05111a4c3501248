package api

import (
	"net/http"
	"sync"

	"google.golang.org/protobuf/reflect/protoreflect"

	librarianv1 "github.com/conclave-ai/conclave/proto/conclave/librarian/v1"
)

// openAPI is the OpenAPI 3.1 document, its schemas generated from the
// conclave.librarian.v1 contract's descriptors, so it cannot drift from the
// messages the handler encodes.
var openAPI = sync.OnceValue(func() map[string]any {
	schemas := map[string]any{}
	var add func(md protoreflect.MessageDescriptor) string
	add = func(md protoreflect.MessageDescriptor) string {
		name := string(md.Name())
		switch md.FullName() {
		case "google.protobuf.Timestamp":
			return ""
		case "google.protobuf.Struct":
			return ""
		}
		if _, done := schemas[name]; done {
			return name
		}
		props := map[string]any{}
		schemas[name] = map[string]any{"type": "object", "properties": props}
		fields := md.Fields()
		for i := range fields.Len() {
			f := fields.Get(i)
			props[string(f.Name())] = fieldSchema(f, add)
		}
		return name
	}
	for _, m := range []protoreflect.ProtoMessage{&librarianv1.AgentRequest{}, &librarianv1.LibrarianResponse{}, &librarianv1.RequestStatus{},
		&librarianv1.ContextQuery{}, &librarianv1.ContextResponse{}, &librarianv1.AgentCapabilities{}, &librarianv1.DecidedRequests{}} {
		add(m.ProtoReflect().Descriptor())
	}
	schemas["Error"] = map[string]any{"type": "object", "properties": map[string]any{"error": map[string]any{"type": "object", "properties": map[string]any{
		"code": map[string]any{"type": "integer"}, "status": map[string]any{"type": "string"}, "message": map[string]any{"type": "string"}, "field": map[string]any{"type": "string"}}}}}
	schemas["ReviewDecision"] = map[string]any{"type": "object", "required": []string{"decision", "comment"}, "properties": map[string]any{
		"decision": map[string]any{"type": "string", "enum": []string{"approve", "reject"}}, "comment": map[string]any{"type": "string"}}}
	ref := func(name string) map[string]any {
		return map[string]any{"content": map[string]any{"application/json": map[string]any{"schema": map[string]any{"$ref": "#/components/schemas/" + name}}}}
	}
	withErrors := func(ok map[string]any, codes ...string) map[string]any {
		resp := map[string]any{"200": ok}
		for _, c := range codes {
			resp[c] = mergeDesc(ref("Error"), http.StatusText(atoi(c)))
		}
		return resp
	}
	bearer := []map[string]any{{"bearer": []string{}}}
	paths := map[string]any{
		"/agent/request": map[string]any{"post": map[string]any{"summary": "Submit an AgentRequest", "security": bearer,
			"requestBody": ref("AgentRequest"), "responses": withErrors(mergeDesc(ref("LibrarianResponse"), "The decision"), "400", "401", "403", "404", "409", "413", "429", "503")}},
		"/agent/status/{request_id}": map[string]any{"get": map[string]any{"summary": "A request's status", "security": bearer,
			"parameters": []any{map[string]any{"name": "request_id", "in": "path", "required": true, "schema": map[string]any{"type": "string"}}},
			"responses":  withErrors(mergeDesc(ref("RequestStatus"), "The status"), "401", "403", "404")}},
		"/agent/context": map[string]any{"post": map[string]any{"summary": "Query the knowledge graph", "security": bearer,
			"requestBody": ref("ContextQuery"), "responses": withErrors(mergeDesc(ref("ContextResponse"), "Ranked nodes"), "400", "401", "403", "413", "429")}},
		"/agent/capabilities": map[string]any{"get": map[string]any{"summary": "The calling agent's registry entry", "security": bearer,
			"responses": withErrors(mergeDesc(ref("AgentCapabilities"), "Capabilities"), "401", "403")}},
		"/reviews": map[string]any{"get": map[string]any{"summary": "Requests waiting for a human (status=escalated, the default), or the decided requests, latest decision first, a page at a time (status=decided) (reviewer token)", "security": bearer,
			"parameters": []any{map[string]any{"name": "status", "in": "query", "schema": map[string]any{"type": "string", "enum": []string{"escalated", "decided"}}},
				map[string]any{"name": "page_size", "in": "query", "description": "status=decided: 1..100, default 50", "schema": map[string]any{"type": "integer", "minimum": 1, "maximum": 100}},
				map[string]any{"name": "page_token", "in": "query", "description": "status=decided: a previous page's next_page_token", "schema": map[string]any{"type": "string"}}},
			"responses": withErrors(map[string]any{"description": "status=escalated: {\"requests\": [RequestStatus]}; status=decided: DecidedRequests",
				"content": map[string]any{"application/json": map[string]any{"schema": map[string]any{"oneOf": []any{
					map[string]any{"type": "object", "properties": map[string]any{"requests": map[string]any{"type": "array", "items": map[string]any{"$ref": "#/components/schemas/RequestStatus"}}}},
					map[string]any{"$ref": "#/components/schemas/DecidedRequests"}}}}}}, "400", "401", "403")}},
		"/reviews/{request_id}/decision": map[string]any{"post": map[string]any{"summary": "Approve or reject an escalated request (reviewer token)", "security": bearer,
			"parameters":  []any{map[string]any{"name": "request_id", "in": "path", "required": true, "schema": map[string]any{"type": "string"}}},
			"requestBody": ref("ReviewDecision"), "responses": withErrors(mergeDesc(ref("RequestStatus"), "The decided request"), "400", "401", "403", "404", "409")}},
		"/metrics": map[string]any{"get": map[string]any{"summary": "Protocol metrics: average validation ms, approval and escalation rates", "security": bearer,
			"responses": withErrors(map[string]any{"description": "avg_validation_ms, approval_rate, escalation_rate (percent)"}, "401")}},
	}
	return map[string]any{
		"openapi": "3.1.0",
		"info":    map[string]any{"title": "Librarian governance API", "version": "1.0", "description": "The Librarian's agent communication protocol."},
		"paths":   paths,
		"components": map[string]any{"schemas": schemas,
			"securitySchemes": map[string]any{"bearer": map[string]any{"type": "http", "scheme": "bearer"}}},
	}
})

func mergeDesc(m map[string]any, desc string) map[string]any {
	m["description"] = desc
	return m
}

func atoi(s string) int {
	n := 0
	for _, c := range s {
		n = n*10 + int(c-'0')
	}
	return n
}

func fieldSchema(f protoreflect.FieldDescriptor, add func(protoreflect.MessageDescriptor) string) map[string]any {
	var s map[string]any
	switch f.Kind() {
	case protoreflect.StringKind:
		s = map[string]any{"type": "string"}
	case protoreflect.BoolKind:
		s = map[string]any{"type": "boolean"}
	case protoreflect.DoubleKind, protoreflect.FloatKind:
		s = map[string]any{"type": "number"}
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Uint32Kind,
		protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Uint64Kind:
		// 64-bit integers too: the API writes them as numbers (marshal).
		s = map[string]any{"type": "integer"}
	case protoreflect.MessageKind:
		switch f.Message().FullName() {
		case "google.protobuf.Timestamp":
			s = map[string]any{"type": "string", "format": "date-time"}
		case "google.protobuf.Struct":
			s = map[string]any{"type": "object"}
		default:
			s = map[string]any{"$ref": "#/components/schemas/" + add(f.Message())}
		}
	default:
		s = map[string]any{}
	}
	if f.IsList() {
		return map[string]any{"type": "array", "items": s}
	}
	return s
}

func (h *Handler) docs(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, openAPI())
}

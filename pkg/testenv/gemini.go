package testenv

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
)

// GeminiAPI is the Gemini API (generativelanguage.googleapis.com) as Gemini
// CLI and the @google/genai SDK call it, on loopback, answering from a
// script instead of a model: a real Gemini CLI pointed at it
// (GOOGLE_GEMINI_BASE_URL) runs whole turns, tool calls included, with no
// model and no network. It serves
//
//	POST /v1beta/models/{model}:streamGenerateContent?alt=sse  the script's reply, as server-sent events
//	POST /v1beta/models/{model}:generateContent                the script's reply, as one JSON object
//	POST /v1beta/models/{model}:countTokens                    a count
//
// and answers anything else 404 in the API's error shape.
type GeminiAPI struct {
	// URL is the base URL, http://127.0.0.1:port.
	URL string

	srv    *http.Server
	ln     net.Listener
	script func(GeminiRequest) GeminiPart

	mu       sync.Mutex
	requests []GeminiRequest
}

// GeminiRequest is a call the API received.
type GeminiRequest struct {
	// Method is streamGenerateContent, generateContent or countTokens.
	Method string `json:"-"`
	Model  string `json:"-"`
	// APIKey is the x-goog-api-key header.
	APIKey   string          `json:"-"`
	Contents []GeminiContent `json:"contents"`
}

// LastUser is the request's last content from the user (a prompt, or the
// tool results the client sends back).
func (r GeminiRequest) LastUser() GeminiContent {
	for i := len(r.Contents) - 1; i >= 0; i-- {
		if r.Contents[i].Role == "user" {
			return r.Contents[i]
		}
	}
	return GeminiContent{}
}

// GeminiContent is one turn of a conversation.
type GeminiContent struct {
	Role  string       `json:"role"`
	Parts []GeminiPart `json:"parts"`
}

// Text is the content's text parts, joined.
func (c GeminiContent) Text() string {
	var b strings.Builder
	for _, p := range c.Parts {
		b.WriteString(p.Text)
	}
	return b.String()
}

// GeminiPart is a part of a content: text, a function call the model
// makes, or the result of one that the client sends back.
type GeminiPart struct {
	Text             string                  `json:"text,omitempty"`
	FunctionCall     *GeminiFunctionCall     `json:"functionCall,omitempty"`
	FunctionResponse *GeminiFunctionResponse `json:"functionResponse,omitempty"`
}

// GeminiFunctionCall is the model's call of a tool.
type GeminiFunctionCall struct {
	ID   string         `json:"id,omitempty"`
	Name string         `json:"name"`
	Args map[string]any `json:"args"`
}

// GeminiFunctionResponse is a tool's result, as the client sends it back.
type GeminiFunctionResponse struct {
	ID       string         `json:"id,omitempty"`
	Name     string         `json:"name"`
	Response map[string]any `json:"response"`
}

// StartGeminiAPI serves the API on a free loopback port until Close. script
// gives the model's reply to each generateContent request: text, or a
// function call.
func StartGeminiAPI(script func(GeminiRequest) GeminiPart) (*GeminiAPI, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	g := &GeminiAPI{URL: "http://" + ln.Addr().String(), ln: ln, script: script}
	g.srv = &http.Server{Handler: http.HandlerFunc(g.serve)}
	go func() { _ = g.srv.Serve(ln) }()
	return g, nil
}

// Close stops the API.
func (g *GeminiAPI) Close() error { return g.srv.Close() }

// Requests returns the calls received so far.
func (g *GeminiAPI) Requests() []GeminiRequest {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]GeminiRequest(nil), g.requests...)
}

func (g *GeminiAPI) serve(w http.ResponseWriter, r *http.Request) {
	// /v1beta/models/gemini-2.5-flash:streamGenerateContent
	rest, ok := strings.CutPrefix(r.URL.Path, "/v1beta/models/")
	model, method, _ := strings.Cut(rest, ":")
	if !ok || r.Method != http.MethodPost {
		geminiError(w, http.StatusNotFound, "NOT_FOUND", "no such method: "+r.Method+" "+r.URL.Path)
		return
	}
	req := GeminiRequest{Method: method, Model: model, APIKey: r.Header.Get("x-goog-api-key")}
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<20)).Decode(&req); err != nil {
		geminiError(w, http.StatusBadRequest, "INVALID_ARGUMENT", "the body is not JSON: "+err.Error())
		return
	}
	g.mu.Lock()
	g.requests = append(g.requests, req)
	g.mu.Unlock()
	usage := map[string]any{"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15}
	candidate := func(parts []GeminiPart, finish bool) map[string]any {
		c := map[string]any{"content": map[string]any{"role": "model", "parts": parts}, "index": 0}
		if finish {
			c["finishReason"] = "STOP"
		}
		return c
	}
	switch method {
	case "countTokens":
		writeJSON(w, map[string]any{"totalTokens": 10})
	case "generateContent":
		writeJSON(w, map[string]any{"candidates": []any{candidate([]GeminiPart{g.script(req)}, true)}, "usageMetadata": usage, "modelVersion": model})
	case "streamGenerateContent":
		reply := g.script(req)
		// Text comes in two chunks, as a model streams it (the first
		// word, then the rest); a function call in one.
		var chunks [][]GeminiPart
		if i := strings.IndexByte(reply.Text, ' '); reply.FunctionCall == nil && i > 0 {
			chunks = [][]GeminiPart{{{Text: reply.Text[:i]}}, {{Text: reply.Text[i:]}}}
		} else {
			chunks = [][]GeminiPart{{reply}}
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		for i, parts := range chunks {
			last := i == len(chunks)-1
			chunk := map[string]any{"candidates": []any{candidate(parts, last)}, "modelVersion": model}
			if last {
				chunk["usageMetadata"] = usage
			}
			data, _ := json.Marshal(chunk)
			fmt.Fprintf(w, "data: %s\r\n\r\n", data)
			if f, ok := w.(http.Flusher); ok {
				f.Flush()
			}
		}
	default:
		geminiError(w, http.StatusNotFound, "NOT_FOUND", "no such method: "+method)
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// geminiError writes the API's error shape (Google's JSON error).
func geminiError(w http.ResponseWriter, code int, status, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"code": code, "message": message, "status": status}})
}

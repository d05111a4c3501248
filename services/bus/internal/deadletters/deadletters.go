// Package deadletters serves the bus's dead letters over HTTP: the
// messages its retries gave up on, for an admin to read and put back on
// the retry queue.
package deadletters

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/conclave-ai/conclave/pkg/ids"
	"github.com/conclave-ai/conclave/pkg/server"
	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/services/bus/internal/broker"
)

// Handlers serve the dead-letter table: list, read and redrive.
type Handlers struct {
	retries *broker.Retries
	log     *slog.Logger
}

// New serves the dead letters of retries; logger records the store's and
// queue's errors, which callers are not shown.
func New(retries *broker.Retries, logger *slog.Logger) *Handlers {
	return &Handlers{retries: retries, log: logger}
}

// Routes registers the handlers, each behind admin, which lets only
// admins through:
//
//	GET  /v1/dead-letters?limit=N&cursor=C   {"dead_letters":[...],"cursor":"..."}
//	GET  /v1/dead-letters/{id}               one dead letter
//	POST /v1/dead-letters/{id}/redrive       back on the retry queue, fresh attempts
//	POST /v1/dead-letters/redrive            every dead letter
func (h *Handlers) Routes(handle func(pattern string, handler http.Handler), admin func(http.Handler) http.Handler) {
	handle("GET /v1/dead-letters", admin(http.HandlerFunc(h.list)))
	handle("GET /v1/dead-letters/{id}", admin(http.HandlerFunc(h.show)))
	handle("POST /v1/dead-letters/{id}/redrive", admin(http.HandlerFunc(h.redrive)))
	handle("POST /v1/dead-letters/redrive", admin(http.HandlerFunc(h.redriveAll)))
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func (h *Handlers) list(w http.ResponseWriter, r *http.Request) {
	limit := 100
	if s := r.URL.Query().Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 1000 {
			server.WriteError(w, http.StatusBadRequest, "bus: limit must be a number from 1 to 1000")
			return
		}
		limit = n
	}
	dls, cursor, err := h.retries.ListDeadLetters(r.Context(), limit, r.URL.Query().Get("cursor"))
	if errors.Is(err, store.ErrInvalid) {
		server.WriteError(w, http.StatusBadRequest, "bus: cursor is not one this bus issued")
		return
	}
	if err != nil {
		h.unavailable(w, r, "listing dead letters", err)
		return
	}
	writeJSON(w, map[string]any{"dead_letters": dls, "cursor": cursor})
}

// deadLetterID is the request's dead-letter id, or "" after answering 400:
// an id the rule refuses never reaches the store.
func deadLetterID(w http.ResponseWriter, r *http.Request) string {
	id := r.PathValue("id")
	if err := ids.DeadLetterID.Check(id); err != nil {
		server.WriteError(w, http.StatusBadRequest, "bus: "+err.Error())
		return ""
	}
	return id
}

func (h *Handlers) show(w http.ResponseWriter, r *http.Request) {
	id := deadLetterID(w, r)
	if id == "" {
		return
	}
	dl, err := h.retries.DeadLetter(r.Context(), id)
	if errors.Is(err, broker.ErrDeadLetterNotFound) {
		server.WriteError(w, http.StatusNotFound, "bus: "+err.Error())
		return
	}
	if err != nil {
		h.unavailable(w, r, "reading a dead letter", err)
		return
	}
	writeJSON(w, dl)
}

func (h *Handlers) redrive(w http.ResponseWriter, r *http.Request) {
	id := deadLetterID(w, r)
	if id == "" {
		return
	}
	err := h.retries.Redrive(r.Context(), id)
	switch {
	case errors.Is(err, broker.ErrDeadLetterNotFound):
		server.WriteError(w, http.StatusNotFound, "bus: "+err.Error())
	case err != nil:
		h.unavailable(w, r, "redriving a dead letter", err)
	default:
		writeJSON(w, map[string]any{"redriven": []string{id}})
	}
}

// unavailable answers a failed store or queue call with 503 and logs its
// error, which may name keys or the caller's input, with the request's
// trace id: the client is told only to retry.
func (h *Handlers) unavailable(w http.ResponseWriter, r *http.Request, what string, err error) {
	h.log.ErrorContext(r.Context(), "bus: "+what+" failed", "error", err)
	w.Header().Set("Retry-After", "1")
	server.WriteError(w, http.StatusServiceUnavailable, "bus: the dead-letter store or the retry queue is unavailable; retry")
}

func (h *Handlers) redriveAll(w http.ResponseWriter, r *http.Request) {
	redriven := []string{}
	cursor := ""
	for {
		dls, next, err := h.retries.ListDeadLetters(r.Context(), 100, cursor)
		if err != nil {
			h.unavailable(w, r, "listing dead letters to redrive (after "+strconv.Itoa(len(redriven))+" redriven)", err)
			return
		}
		for _, dl := range dls {
			if err := h.retries.Redrive(r.Context(), dl.ID); err != nil {
				h.unavailable(w, r, "redriving "+dl.ID+" (after "+strconv.Itoa(len(redriven))+" redriven)", err)
				return
			}
			redriven = append(redriven, dl.ID)
		}
		if next == "" {
			break
		}
		cursor = next
	}
	writeJSON(w, map[string]any{"redriven": redriven})
}

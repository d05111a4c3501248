package service

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/conclave-ai/conclave/pkg/ids"
	"github.com/conclave-ai/conclave/pkg/server"
	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/services/bus/internal/broker"
)

// routeDeadLetters serves the dead-letter table to admins:
//
//	GET  /v1/dead-letters?limit=N&cursor=C   {"dead_letters":[...],"cursor":"..."}
//	GET  /v1/dead-letters/{id}               one dead letter
//	POST /v1/dead-letters/{id}/redrive       back on the retry queue, fresh attempts
//	POST /v1/dead-letters/redrive            every dead letter
func (b *Bus) routeDeadLetters(srv *server.Server) {
	srv.Handle("GET /v1/dead-letters", b.admin(b.listDeadLetters))
	srv.Handle("GET /v1/dead-letters/{id}", b.admin(b.showDeadLetter))
	srv.Handle("POST /v1/dead-letters/{id}/redrive", b.admin(b.redriveDeadLetter))
	srv.Handle("POST /v1/dead-letters/redrive", b.admin(b.redriveAll))
}

func (b *Bus) admin(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !b.cfg.AllowUnauthenticated {
			grant, present, err := b.authenticate(w, r)
			switch {
			case !present:
				server.WriteError(w, http.StatusUnauthorized, "bus: a bearer token is required")
				return
			case err != nil:
				writeAuthError(w, err)
				return
			case !grant.Admin:
				server.WriteError(w, http.StatusForbidden, "bus: this token is not an admin's")
				return
			}
		}
		h(w, r)
	})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func (b *Bus) listDeadLetters(w http.ResponseWriter, r *http.Request) {
	limit := 100
	if s := r.URL.Query().Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 1000 {
			server.WriteError(w, http.StatusBadRequest, "bus: limit must be a number from 1 to 1000")
			return
		}
		limit = n
	}
	dls, cursor, err := b.retries.ListDeadLetters(r.Context(), limit, r.URL.Query().Get("cursor"))
	if errors.Is(err, store.ErrInvalid) {
		server.WriteError(w, http.StatusBadRequest, "bus: cursor is not one this bus issued")
		return
	}
	if err != nil {
		b.unavailable(w, r, "listing dead letters", err)
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

func (b *Bus) showDeadLetter(w http.ResponseWriter, r *http.Request) {
	id := deadLetterID(w, r)
	if id == "" {
		return
	}
	dl, err := b.retries.DeadLetter(r.Context(), id)
	if errors.Is(err, broker.ErrDeadLetterNotFound) {
		server.WriteError(w, http.StatusNotFound, "bus: "+err.Error())
		return
	}
	if err != nil {
		b.unavailable(w, r, "reading a dead letter", err)
		return
	}
	writeJSON(w, dl)
}

func (b *Bus) redriveDeadLetter(w http.ResponseWriter, r *http.Request) {
	id := deadLetterID(w, r)
	if id == "" {
		return
	}
	err := b.retries.Redrive(r.Context(), id)
	switch {
	case errors.Is(err, broker.ErrDeadLetterNotFound):
		server.WriteError(w, http.StatusNotFound, "bus: "+err.Error())
	case err != nil:
		b.unavailable(w, r, "redriving a dead letter", err)
	default:
		writeJSON(w, map[string]any{"redriven": []string{id}})
	}
}

// unavailable answers a failed store or queue call with 503 and logs its
// error, which may name keys or the caller's input, with the request's
// trace id: the client is told only to retry.
func (b *Bus) unavailable(w http.ResponseWriter, r *http.Request, what string, err error) {
	b.log.ErrorContext(r.Context(), "bus: "+what+" failed", "error", err)
	w.Header().Set("Retry-After", "1")
	server.WriteError(w, http.StatusServiceUnavailable, "bus: the dead-letter store or the retry queue is unavailable; retry")
}

func (b *Bus) redriveAll(w http.ResponseWriter, r *http.Request) {
	redriven := []string{}
	cursor := ""
	for {
		dls, next, err := b.retries.ListDeadLetters(r.Context(), 100, cursor)
		if err != nil {
			b.unavailable(w, r, "listing dead letters to redrive (after "+strconv.Itoa(len(redriven))+" redriven)", err)
			return
		}
		for _, dl := range dls {
			if err := b.retries.Redrive(r.Context(), dl.ID); err != nil {
				b.unavailable(w, r, "redriving "+dl.ID+" (after "+strconv.Itoa(len(redriven))+" redriven)", err)
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

package web

import (
	"encoding/json"
	"net/http"
	"strings"

	"github.com/conclave-ai/conclave/pkg/ids"
	"github.com/conclave-ai/conclave/services/console/internal/backend"
	"github.com/conclave-ai/conclave/services/console/internal/session"
)

type busData struct {
	Pattern     string
	Bus         panel
	DeadLetters []backend.DeadLetter
	Cursor      string
	// Published is the result of the publish form, for the page without
	// JavaScript.
	Published *backend.PublishResult
	Topic     string
	Payload   string
}

// maxPattern is the bus's own limit on topics and patterns.
const maxPattern = 256

func (h *Handler) bus(w http.ResponseWriter, r *http.Request, s session.Session) {
	h.renderBus(w, r, s, busData{Pattern: strings.TrimSpace(r.URL.Query().Get("pattern"))}, http.StatusOK)
}

func (h *Handler) renderBus(w http.ResponseWriter, r *http.Request, s session.Session, d busData, status int) {
	dls, cursor, err := h.o.Bus.DeadLetters(r.Context(), s.Tokens.Bus, r.URL.Query().Get("cursor"), 50)
	d.Bus, d.DeadLetters, d.Cursor = panelOf("bus", err), dls, cursor
	h.render(w, r, status, "bus", s, page{Title: "Bus", Section: "bus", Flash: flash(r), D: d})
}

func (h *Handler) publish(w http.ResponseWriter, r *http.Request, s session.Session) {
	topic := strings.TrimSpace(r.PostForm.Get("topic"))
	payload := strings.TrimSpace(r.PostForm.Get("payload"))
	if err := validText("The topic", topic, maxPattern); err != nil {
		h.problem(w, r, http.StatusBadRequest, err.Error())
		return
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal([]byte(payload), &obj); err != nil || obj == nil {
		h.problem(w, r, http.StatusBadRequest, "The payload must be a JSON object, such as {\"type\":\"note\",\"text\":\"hello\"}.")
		return
	}
	res, err := h.o.Bus.Publish(r.Context(), s.Tokens.Bus, topic, json.RawMessage(payload))
	if err != nil {
		h.backendProblem(w, r, err)
		return
	}
	if wantsJSON(r) {
		writeJSON(w, http.StatusOK, map[string]any{"result": res, "trace_url": h.traceURL(res.TraceID)})
		return
	}
	h.renderBus(w, r, s, busData{Published: &res, Topic: topic, Payload: payload}, http.StatusOK)
}

type deadLetterData struct {
	Bus panel
	DL  backend.DeadLetter
}

func (h *Handler) deadLetter(w http.ResponseWriter, r *http.Request, s session.Session) {
	if !h.checkID(w, r, ids.DeadLetterID, r.PathValue("id")) {
		return
	}
	dl, err := h.o.Bus.DeadLetter(r.Context(), s.Tokens.Bus, r.PathValue("id"))
	if backend.IsKind(err, backend.Rejected) {
		h.problem(w, r, backend.StatusOf(err), err.Error())
		return
	}
	h.render(w, r, http.StatusOK, "deadletter", s, page{Title: "Dead letter " + r.PathValue("id"), Section: "bus", D: deadLetterData{Bus: panelOf("bus", err), DL: dl}})
}

// redrive serves both POST /bus/dead-letters/{id}/redrive and
// POST /bus/dead-letters/redrive (every dead letter).
func (h *Handler) redrive(w http.ResponseWriter, r *http.Request, s session.Session) {
	if id := r.PathValue("id"); id != "" && !h.checkID(w, r, ids.DeadLetterID, id) {
		return
	}
	if err := h.o.Bus.Redrive(r.Context(), s.Tokens.Bus, r.PathValue("id")); err != nil {
		h.backendProblem(w, r, err)
		return
	}
	http.Redirect(w, r, "/bus?done=redriven", http.StatusSeeOther)
}

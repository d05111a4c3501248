package service

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/conclave-ai/conclave/pkg/govern"
	"github.com/conclave-ai/conclave/services/runner/internal/agenttype"
	"github.com/conclave-ai/conclave/services/runner/internal/metrics"
)

// governed lists the enabled agent types under the librarian policy.
func governed(registry *agenttype.Registry) []string {
	var ids []string
	for _, t := range registry.List() {
		if t.Enabled && t.Permission == agenttype.PermissionLibrarian {
			ids = append(ids, t.ID)
		}
	}
	return ids
}

// librarianTokens parses CONCLAVE_RUNNER_LIBRARIAN_TOKENS.
func (c Config) librarianTokens() (map[string]string, error) {
	tokens := map[string]string{}
	for _, pair := range c.LibrarianTokens {
		id, tok, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if !ok || id == "" || len(tok) < 16 {
			return nil, fmt.Errorf("CONCLAVE_RUNNER_LIBRARIAN_TOKENS: each entry is agent_type=token, the token at least 16 characters")
		}
		if _, dup := tokens[id]; dup {
			return nil, fmt.Errorf("CONCLAVE_RUNNER_LIBRARIAN_TOKENS: agent type %s appears twice", id)
		}
		tokens[id] = tok
	}
	return tokens, nil
}

// validateGovernance checks the settings the librarian policy needs, when
// an agent type uses it.
func (c Config) validateGovernance(registry *agenttype.Registry) error {
	tokens, err := c.librarianTokens()
	if err != nil {
		return err
	}
	for _, u := range []struct{ key, url, scheme string }{
		{"CONCLAVE_RUNNER_LIBRARIAN_URL", c.LibrarianURL, "http"}, {"CONCLAVE_RUNNER_BUS_URL", c.BusURL, "ws"},
	} {
		if u.url == "" {
			continue
		}
		if p, err := url.Parse(u.url); err != nil || (p.Scheme != u.scheme && p.Scheme != u.scheme+"s") || p.Host == "" {
			return fmt.Errorf("%s: %q is not a %s:// or %ss:// URL", u.key, u.url, u.scheme, u.scheme)
		}
	}
	types := governed(registry)
	if len(types) == 0 {
		return nil
	}
	if c.LibrarianURL == "" || c.BusURL == "" {
		return fmt.Errorf("CONCLAVE_RUNNER_LIBRARIAN_URL and CONCLAVE_RUNNER_BUS_URL: agent types %s ask the Librarian (permission librarian); set both", strings.Join(types, ", "))
	}
	if len(tokens) > 0 {
		for _, id := range types {
			if tokens[id] == "" {
				return fmt.Errorf("CONCLAVE_RUNNER_LIBRARIAN_TOKENS: agent type %s asks the Librarian and has no token", id)
			}
		}
	}
	return nil
}

// newGovernance builds what the librarian permission policy runs on: a
// client of the Librarian's API and a watcher of its decisions on the bus.
// Both are nil when no agent type asks the Librarian and neither address is
// set.
func newGovernance(cfg Config, deps Deps, registry *agenttype.Registry, serverID string, m *metrics.Metrics) (*govern.Governor, *govern.Watcher, error) {
	librarianURL, busURL := func() string { return cfg.LibrarianURL }, func() string { return cfg.BusURL }
	if deps.LibrarianURL != nil {
		librarianURL = deps.LibrarianURL
	}
	if deps.BusURL != nil {
		busURL = deps.BusURL
	}
	if len(governed(registry)) == 0 && cfg.LibrarianURL == "" && deps.LibrarianURL == nil {
		return nil, nil, nil
	}
	tokens, err := cfg.librarianTokens()
	if err != nil {
		return nil, nil, err
	}
	tel := deps.Telemetry
	client := govern.NewClient(librarianURL, func(agentType string) string { return tokens[agentType] },
		&http.Client{Transport: tel.HTTPTransport(nil), Timeout: 15 * time.Second})
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	watcher := govern.NewWatcher(govern.WatcherOptions{URL: busURL, Token: cfg.BusToken,
		// Each replica, and each run of one, subscribes for itself.
		ClientID: "runner-" + serverID + "-" + hex.EncodeToString(suffix), Status: client.Status, Logger: deps.Logger})
	return govern.NewGovernor(client, watcher, m, tel.TracerProvider(), deps.Logger), watcher, nil
}

// GovernedTypes lists the enabled agent types of cfg's registry under the
// librarian policy: conclave dev registers them with its Librarian.
func GovernedTypes(cfg Config) ([]string, error) {
	registry, err := agenttype.Load(cfg.AgentTypesFile)
	if err != nil {
		return nil, fmt.Errorf("CONCLAVE_RUNNER_AGENT_TYPES: %w", err)
	}
	return governed(registry), nil
}

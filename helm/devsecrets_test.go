package helm

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

const (
	// devSecret is the Secret devSecrets.generate makes for release.
	devSecret = release + "-dev-secrets"
	// devAgentID is devSecrets.agentId's default.
	devAgentID = "dev-agent"
	// minTokenLength is pkg/auth's MinTokenLength: every service refuses
	// a shorter token at start.
	minTokenLength = 16
	// minHostKeyBytes is the runner's shortest CONCLAVE_RUNNER_HOST_KEY.
	minHostKeyBytes = 32
)

// devSecretSettings are the settings each deployable reads from the
// generated Secret in the dev render: every secret setting it has
// (bus.runnerAgentType is empty there, so the bus has no runner token).
var devSecretSettings = map[string][]string{
	"gateway": {"CONCLAVE_GATEWAY_CLIENT_TOKENS", "CONCLAVE_GATEWAY_AGENT_TOKENS"},
	"bus":     {"CONCLAVE_BUS_GRANTS", "CONCLAVE_BUS_PEER_TOKEN"},
	"runner":  {"CONCLAVE_RUNNER_CLIENT_TOKENS", "CONCLAVE_RUNNER_HOST_KEY", "CONCLAVE_RUNNER_GATEWAY_TOKEN"},
	"console": {"CONCLAVE_CONSOLE_SESSION_KEY", "CONCLAVE_CONSOLE_EVENTS_BUS_TOKEN"},
}

// devSecretKeys are the generated Secret's keys: the two for people and
// agents, and one per secret setting.
var devSecretKeys = []string{
	"dev-token", "agent-token",
	"gateway-client-tokens", "gateway-agent-tokens",
	"bus-grants", "bus-peer-token", "bus-runner-token",
	"runner-client-tokens", "runner-host-key", "runner-gateway-token",
	"console-session-key", "console-events-bus-token",
}

// generatedToken is the form of every token the chart makes: 32 letters
// and digits, so never a "," or "=", where the lists and pairs are split.
var generatedToken = regexp.MustCompile(`^[A-Za-z0-9]{32}$`)

// busGrant is the part of the bus's grant (CONCLAVE_BUS_GRANTS) checked.
type busGrant struct {
	Token     string   `json:"token"`
	ClientID  string   `json:"client_id"`
	Publish   []string `json:"publish"`
	Subscribe []string `json:"subscribe"`
	Admin     bool     `json:"admin"`
}

// checkDevSecret checks the Secret devSecrets.generate makes: it holds
// every key, each secret setting of every rendered deployable comes from
// it, and its values pass the services' own rules (tokens of at least 16
// characters, a host key of at least 32 bytes, a session key of base64 of
// 32 bytes, grants that parse) and fit together: dev-token is a client
// token of the gateway and the runner and an admin grant of the bus, the
// bus's runner token one of the runner's client tokens, the console's
// events token a bus grant that may subscribe to the Librarian's
// decisions, agentID's token agent-token. It returns the Secret's values.
func checkDevSecret(t *testing.T, r rendered, agentID string) map[string]string {
	t.Helper()
	s, ok := r.secrets[devSecret]
	if !ok {
		t.Fatalf("no Secret %s (Secrets: %v)", devSecret, keys(r.secrets))
	}
	if len(r.secrets) != 1 {
		t.Errorf("Secrets %v, want only %s", keys(r.secrets), devSecret)
	}
	if len(s.StringData) > 0 {
		t.Errorf("Secret %s has stringData %v, want data only", devSecret, keys(s.StringData))
	}
	v := map[string]string{}
	for key, data := range s.Data {
		v[key] = string(data)
	}
	got := keys(v)
	slices.Sort(got)
	want := slices.Clone(devSecretKeys)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("Secret %s has keys %v, want %v", devSecret, got, want)
	}

	// Every secret setting of every deployable comes from the Secret, by
	// a key it has.
	for _, d := range deployables {
		dep, ok := r.deployments[release+"-"+d]
		if !ok {
			continue
		}
		var fromSecret []string
		for _, e := range dep.Spec.Template.Spec.Containers[0].Env {
			if !secretSettings.MatchString(e.Name) || strings.HasPrefix(e.Name, "AWS_") {
				continue
			}
			if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Name != devSecret {
				t.Errorf("%s: %s comes from %+v, want Secret %s", d, e.Name, e.ValueFrom, devSecret)
				continue
			}
			if key := e.ValueFrom.SecretKeyRef.Key; v[key] == "" {
				t.Errorf("%s: %s comes from key %q, which Secret %s lacks", d, e.Name, key, devSecret)
			}
			fromSecret = append(fromSecret, e.Name)
		}
		for _, name := range devSecretSettings[d] {
			if !slices.Contains(fromSecret, name) {
				t.Errorf("%s: no %s from Secret %s (it has %v)", d, name, devSecret, fromSecret)
			}
		}
	}

	// The values, as the services check them at start.
	token := func(what, tok string) {
		t.Helper()
		if len(tok) < minTokenLength {
			t.Errorf("%s is %d characters long, want at least %d", what, len(tok), minTokenLength)
		}
		if !generatedToken.MatchString(tok) {
			t.Errorf("%s is not 32 letters and digits", what)
		}
	}
	dev := v["dev-token"]
	for _, key := range []string{"dev-token", "agent-token", "bus-peer-token", "bus-runner-token", "console-events-bus-token", "gateway-client-tokens"} {
		token(key, v[key])
	}
	if v["gateway-client-tokens"] != dev {
		t.Errorf("gateway-client-tokens is not dev-token alone")
	}
	runnerTokens := strings.Split(v["runner-client-tokens"], ",")
	for i, tok := range runnerTokens {
		token(fmt.Sprintf("runner-client-tokens entry %d", i+1), tok)
	}
	if !slices.Equal(runnerTokens, []string{dev, v["bus-runner-token"]}) {
		t.Errorf("runner-client-tokens is not dev-token and bus-runner-token")
	}
	// The dev agent's pair, and the pattern that opens every other id
	// to the runner's agents.
	agentPair, runnerPair, _ := strings.Cut(v["gateway-agent-tokens"], ",")
	id, tok, ok := strings.Cut(agentPair, "=")
	if !ok || id != agentID || tok != v["agent-token"] {
		t.Errorf("gateway-agent-tokens does not begin %s=<agent-token> (agent %q)", agentID, id)
	}
	token("gateway-agent-tokens' token", tok)
	if pattern, tok, _ := strings.Cut(runnerPair, "="); pattern != "*" || tok != v["runner-gateway-token"] {
		t.Errorf("gateway-agent-tokens does not end *=<runner-gateway-token> (pattern %q)", pattern)
	}
	token("runner-gateway-token", v["runner-gateway-token"])
	if n := len(v["runner-host-key"]); n < minHostKeyBytes {
		t.Errorf("runner-host-key is %d bytes, want at least %d", n, minHostKeyBytes)
	}
	// The console decodes it with base64.StdEncoding and wants 32 bytes.
	if key, err := base64.StdEncoding.DecodeString(v["console-session-key"]); err != nil || len(key) != 32 {
		t.Errorf("console-session-key is not base64 of 32 bytes (%d bytes, %v)", len(key), err)
	}

	var grants []busGrant
	dec := json.NewDecoder(strings.NewReader(v["bus-grants"]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&grants); err != nil {
		t.Fatalf("bus-grants is not a JSON array of grants: %v", err)
	}
	byToken := map[string]busGrant{}
	for i, g := range grants {
		token(fmt.Sprintf("bus grant %d's token", i+1), g.Token)
		if _, dup := byToken[g.Token]; dup {
			t.Errorf("bus-grants holds a token twice")
		}
		byToken[g.Token] = g
	}
	if g := byToken[dev]; !g.Admin || !slices.Equal(g.Publish, []string{"*"}) || !slices.Equal(g.Subscribe, []string{"*"}) || g.ClientID != "" {
		t.Errorf("dev-token's bus grant is %+v, want an admin with every topic and any client id", redacted(g))
	}
	if g, ok := byToken[v["console-events-bus-token"]]; !ok || g.Admin || len(g.Publish) > 0 || !slices.Equal(g.Subscribe, []string{"system:librarian.request.*"}) {
		t.Errorf("console-events-bus-token's bus grant is %+v (found %v), want subscribe system:librarian.request.* only", redacted(g), ok)
	}
	if len(grants) != 2 {
		t.Errorf("bus-grants holds %d grants, want dev-token's and the console's", len(grants))
	}
	return v
}

// redacted is g without its token, for a message.
func redacted(g busGrant) busGrant {
	g.Token = "<redacted>"
	return g
}

// TestDevSecrets renders devSecrets.generate beyond the dev values: with
// the default values (whose Secret names it replaces, so they may be
// empty), another agent id, and the bus launching through the runner
// (whose token the runner must take); and checks helm template makes new
// values each time, as docs/deploy.md says.
func TestDevSecrets(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		files   []string
		set     []string
		agentID string
	}{
		{
			name: "default values, their Secrets unnamed",
			set: []string{
				"devSecrets.generate=true", "gateway.secret.name=", "bus.secret.name=", "runner.secret.name=",
				"runner.secret.hostKeyKey=", "console.secret.name=", "console.secret.sessionKeyKey=",
			},
			agentID: devAgentID,
		},
		{
			name:    "another agent id",
			files:   valuesFiles["dev"],
			set:     []string{"devSecrets.agentId=my-agent.v2"},
			agentID: "my-agent.v2",
		},
		{
			name:    "the bus launches through the runner",
			files:   valuesFiles["dev"],
			set:     []string{"bus.runnerAgentType=acp-agent"},
			agentID: devAgentID,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := index(t, render(t, tc.files, tc.set...))
			for _, d := range deployables {
				checkDeployable(t, r, d)
			}
			v := checkDevSecret(t, r, tc.agentID)
			if tc.name != "the bus launches through the runner" {
				return
			}
			var ref *corev1.SecretKeySelector
			for _, e := range r.deployments[release+"-bus"].Spec.Template.Spec.Containers[0].Env {
				if e.Name == "CONCLAVE_BUS_RUNNER_TOKEN" && e.ValueFrom != nil {
					ref = e.ValueFrom.SecretKeyRef
				}
			}
			if ref == nil || ref.Name != devSecret || !slices.Contains(strings.Split(v["runner-client-tokens"], ","), v[ref.Key]) {
				t.Errorf("CONCLAVE_BUS_RUNNER_TOKEN comes from %+v, want a key of %s holding one of the runner's client tokens", ref, devSecret)
			}
		})
	}

	t.Run("new values each render", func(t *testing.T) {
		t.Parallel()
		first := checkDevSecret(t, index(t, render(t, valuesFiles["dev"])), devAgentID)
		second := checkDevSecret(t, index(t, render(t, valuesFiles["dev"])), devAgentID)
		for _, key := range devSecretKeys {
			if first[key] == second[key] {
				t.Errorf("two renders made the same %s", key)
			}
		}
	})
}

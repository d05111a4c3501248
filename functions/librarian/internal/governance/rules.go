package governance

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strings"

	librarianv1 "github.com/conclave-ai/conclave/proto/conclave/librarian/v1"
)

// RequiredFields is the protocol's REQUIRED_FIELDS per request type; rationale
// is required for APPROVAL only while require_rationale is set.
type RequiredFields struct{}

func (RequiredFields) Name() string { return "required_fields" }

func (r RequiredFields) Check(_ context.Context, in *Input) (Outcome, error) {
	req := in.Request
	present := map[string]bool{
		"agent_id":     req.GetAgentId() != "",
		"request_type": req.GetRequestType() != "",
		"action":       req.GetAction() != "",
		"content":      strings.TrimSpace(req.GetContent()) != "",
		"rationale":    strings.TrimSpace(req.GetRationale()) != "",
		"target_type":  req.GetTargetType() != "",
		"request_id":   req.GetRequestId() != "",
		"completed":    req.Completed != nil,
		"changes_made": len(req.GetChangesMade()) > 0,
	}
	needed := []string{"agent_id", "request_type"}
	switch req.GetRequestType() {
	case TypeApproval:
		needed = append(needed, "action", "content", "target_type")
		if in.Protocol.Compliance.RequireRationale {
			needed = append(needed, "rationale")
		}
	case TypeQuery:
		needed = append(needed, "content")
	case TypeValidate:
		needed = append(needed, "content", "target_type")
	case TypeReport:
		needed = append(needed, "request_id", "completed", "changes_made")
	}
	var out Outcome
	for _, f := range needed {
		if !present[f] {
			out.Violations = append(out.Violations, violation(r.Name(), f, "error", "%s is required for %s requests", f, orAny(req.GetRequestType())))
			out.Suggestions = append(out.Suggestions, "Set "+f+".")
		}
	}
	if len(out.Violations) > 0 {
		out.Verdict = Reject
	}
	return out, nil
}

func orAny(t string) string {
	if t == "" {
		return "all"
	}
	return t
}

// Authorization checks the agent's capabilities and allowed_targets, and
// that a REPORT is about the agent's own request.
type Authorization struct{ Requests Requests }

func (Authorization) Name() string { return "agent_authorization" }

// capabilityFor is what each kind of request needs; any one of the list.
func capabilityFor(requestType, action string) []string {
	switch {
	case requestType == TypeQuery, requestType == TypeApproval && action == ActionRead:
		return []string{"read"}
	case requestType == TypeValidate:
		return []string{"validate", "write", "suggest"}
	default: // a change, or a report of one
		return []string{"write"}
	}
}

func (a Authorization) Check(ctx context.Context, in *Input) (Outcome, error) {
	req := in.Request
	need := capabilityFor(req.GetRequestType(), req.GetAction())
	if !slices.ContainsFunc(need, in.Agent.Can) {
		what := strings.ToLower(req.GetRequestType())
		if req.GetRequestType() == TypeApproval {
			what = req.GetAction()
		}
		return deny(http.StatusForbidden, "capability_missing", "agent %q lacks the %s capability needed to %s (it has %s)",
			in.Agent.ID, strings.Join(need, " or "), what, strings.Join(in.Agent.Capabilities, ", ")), nil
	}
	if t := req.GetTargetType(); t != "" && !in.Agent.MayTarget(t) {
		return deny(http.StatusForbidden, "target_not_allowed", "agent %q may not target %s (allowed_targets: %s)",
			in.Agent.ID, t, strings.Join(in.Agent.AllowedTargets, ", ")), nil
	}
	if req.GetRequestType() == TypeReport {
		owner, found, err := a.Requests.Owner(ctx, req.GetRequestId())
		switch {
		case err != nil:
			return Outcome{}, err
		case !found:
			return deny(http.StatusNotFound, "request_not_found", "request %q does not exist", clip(req.GetRequestId())), nil
		case owner != in.Agent.ID:
			return deny(http.StatusForbidden, "not_your_request", "request %q belongs to another agent", clip(req.GetRequestId())), nil
		}
	}
	return Outcome{}, nil
}

// RateLimits counts the request against the API's and the agent's limits.
type RateLimits struct{ Limiter Limiter }

func (RateLimits) Name() string { return "rate_limits" }

func (r RateLimits) Check(ctx context.Context, in *Input) (Outcome, error) {
	all, err := r.Limiter.Take(ctx, in.Agent)
	if err != nil {
		return Outcome{}, err
	}
	// The limit that frees up last is the one to wait for; on a tie (an
	// hour and a minute ending together) the later one listed, the
	// agent's own.
	var worst *Allowance
	for i := range all {
		if !all[i].Allowed && (worst == nil || !worst.Reset.After(all[i].Reset)) {
			worst = &all[i]
		}
	}
	if worst == nil {
		return Outcome{}, nil
	}
	out := deny(http.StatusTooManyRequests, "rate_limited", "rate limit exceeded: %d requests per %s window (%s limit); retry after %s",
		worst.Limit, windowName(worst), worst.Name, worst.Reset.UTC().Format("15:04:05Z"))
	out.Denial.Allowance = worst
	return out, nil
}

func windowName(a *Allowance) string {
	if a.Name == "api" {
		return "minute"
	}
	return "registry"
}

// Template is a content format: a title line and the sections it needs.
type Template struct {
	// Source names the template file, for suggestions.
	Source   string
	Title    bool
	Sections []string
}

var heading = regexp.MustCompile(`(?m)^(#{1,2})\s+(.+?)\s*$`)

// ParseTemplate reads a Markdown template: a "# " line means content needs a
// title, and every "## " heading is a section content must have.
func ParseTemplate(source, text string) Template {
	t := Template{Source: source}
	for _, m := range heading.FindAllStringSubmatch(text, -1) {
		if m[1] == "#" {
			t.Title = true
		} else {
			t.Sections = append(t.Sections, m[2])
		}
	}
	return t
}

// ContentFormat checks content against its target type's template; in
// strict_mode a mismatch rejects, otherwise it warns.
type ContentFormat struct{ Templates Templates }

func (ContentFormat) Name() string { return "content_format" }

func (c ContentFormat) Check(_ context.Context, in *Input) (Outcome, error) {
	req := in.Request
	changes := req.GetRequestType() == TypeValidate ||
		(req.GetRequestType() == TypeApproval && (req.GetAction() == ActionCreate || req.GetAction() == ActionModify))
	if !changes {
		return Outcome{}, nil
	}
	var out Outcome
	severity, verdict := "warning", Warn
	if in.Protocol.Compliance.StrictMode {
		severity, verdict = "error", Reject
	}
	if strings.ContainsRune(req.GetContent(), 0) {
		out.Violations = append(out.Violations, violation(c.Name(), "content", severity, "content contains NUL bytes"))
	}
	if t, ok := c.Templates.Template(req.GetTargetType()); ok {
		found := map[string]bool{}
		title := false
		for _, m := range heading.FindAllStringSubmatch(req.GetContent(), -1) {
			if m[1] == "#" {
				title = true
			} else {
				found[strings.ToLower(m[2])] = true
			}
		}
		if t.Title && !title {
			out.Violations = append(out.Violations, violation(c.Name(), "content", severity, "content needs a \"# \" title (template %s)", t.Source))
		}
		for _, s := range t.Sections {
			if !found[strings.ToLower(s)] {
				out.Violations = append(out.Violations, violation(c.Name(), "content", severity, "content lacks the section \"## %s\" (template %s)", s, t.Source))
			}
		}
		if len(out.Violations) > 0 {
			out.Suggestions = append(out.Suggestions, fmt.Sprintf("Follow %s, and check with a VALIDATE request first.", t.Source))
		}
	}
	if len(out.Violations) > 0 {
		out.Verdict = verdict
	}
	return out, nil
}

// References checks that every referenced specification, and every node
// the target declares it depends on, is a graph node; unknown ones reject
// under enforce_references, otherwise they warn.
type References struct{ Graph Graph }

func (References) Name() string { return "references" }

func (r References) Check(ctx context.Context, in *Input) (Outcome, error) {
	refs, deps := in.Request.GetReferences(), in.Request.GetDependsOn()
	if len(refs)+len(deps) == 0 {
		return Outcome{}, nil
	}
	missing, err := r.Graph.Missing(ctx, append(slices.Clone(refs), deps...))
	if err != nil || len(missing) == 0 {
		return Outcome{}, err
	}
	severity, verdict := "warning", Warn
	if in.Protocol.Compliance.EnforceReferences {
		severity, verdict = "error", Reject
	}
	out := Outcome{Verdict: verdict, Suggestions: []string{"Query the available specifications first (POST /agent/context) and cite their ids."}}
	for _, id := range missing {
		if slices.Contains(refs, id) {
			out.Violations = append(out.Violations, violation("invalid_reference", "references", severity, "invalid reference: %q is not in the knowledge graph", clip(id)))
		}
		if slices.Contains(deps, id) {
			out.Violations = append(out.Violations, violation("invalid_dependency", "depends_on", severity, "invalid dependency: %q is not in the knowledge graph", clip(id)))
		}
	}
	return out, nil
}

// TargetExists resolves the target of a change: a modify or delete needs
// an existing node, a create a free location, which becomes the assigned
// node's. A target it cannot tell asks for clarification.
type TargetExists struct{ Graph Graph }

func (TargetExists) Name() string { return "target_exists" }

// defaultDirs are where a create without target_path goes, by target type;
// code and tests have no default, their path must be given.
var defaultDirs = map[string]string{"architecture": "docs/architecture", "design": "docs/design", "docs": "docs"}

func (t TargetExists) Check(ctx context.Context, in *Input) (Outcome, error) {
	req := in.Request
	if req.GetRequestType() != TypeApproval && req.GetRequestType() != TypeValidate {
		return Outcome{}, nil
	}
	id, path := req.GetTargetId(), req.GetTargetPath()
	// With require_known_targets off, a change the graph cannot place (no
	// target named, or one it does not hold) is judged by the rules after
	// this one rather than sent back: how an operator governs agents that
	// edit files the graph does not track (docs/governance.md).
	known := in.Protocol.Compliance.RequireKnownTargets
	switch req.GetAction() {
	case ActionCreate:
		if path == "" {
			dir, ok := defaultDirs[req.GetTargetType()]
			slug := Slug(Title(req.GetContent()))
			if (!ok || slug == "") && !known && id == "" {
				return Outcome{}, nil
			}
			if !ok || slug == "" {
				return Outcome{Verdict: Clarify, Reason: fmt.Sprintf("target_path is needed to create %s (there is no default location without a title)", req.GetTargetType()),
					Suggestions: []string{"Set target_path to where the new item should live."}}, nil
			}
			path = dir + "/" + slug + ".md"
		}
		existing, err := t.Graph.Resolve(ctx, id, path)
		if err != nil {
			return Outcome{}, err
		}
		if existing != "" {
			return Outcome{Verdict: Reject, Violations: []*librarianv1.ViolationDetail{violation(t.Name(), "target_path", "error", "%s already exists as node %s", path, existing)},
				Suggestions: []string{"Use action modify to change an existing item."}}, nil
		}
		in.Location = path
		in.Subject = AssignID(req.GetTargetType(), path)
		if id != "" {
			in.Subject = id
		}
	case ActionModify, ActionDelete, ActionRead:
		if id == "" && path == "" {
			if req.GetAction() == ActionRead || !known {
				return Outcome{}, nil
			}
			return Outcome{Verdict: Clarify, Reason: fmt.Sprintf("a %s needs target_id or target_path to say which item", req.GetAction()),
				Suggestions: []string{"Set target_id (a graph node id) or target_path."}}, nil
		}
		existing, err := t.Graph.Resolve(ctx, id, path)
		if err != nil {
			return Outcome{}, err
		}
		if existing == "" && !known {
			in.Location = path
			return Outcome{}, nil
		}
		if existing == "" {
			return Outcome{Verdict: Reject, Violations: []*librarianv1.ViolationDetail{violation(t.Name(), "target_id", "error", "the target %s does not exist", clip(firstOf(id, path)))},
				Suggestions: []string{"Query the knowledge graph for the item's id, or use action create."}}, nil
		}
		in.Subject, in.Location = existing, path
	}
	return Outcome{}, nil
}

func firstOf(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// AssignID is the node id an approved create gets: the target type's
// prefix and a digest of its location, so the same location always gets
// the same id.
func AssignID(targetType, location string) string {
	sum := sha256.Sum256([]byte(location))
	prefix := targetType
	if prefix == "architecture" {
		prefix = "arch"
	}
	return prefix + "-" + hex.EncodeToString(sum[:5])
}

// Title is content's first "# " heading.
func Title(content string) string {
	for _, m := range heading.FindAllStringSubmatch(content, -1) {
		if m[1] == "#" {
			return m[2]
		}
	}
	return ""
}

// Slug turns a title into a file name: lower case letters and digits
// joined by '-', at most 60 bytes.
func Slug(title string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(title) {
		switch {
		case r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			if dash && b.Len() > 0 {
				b.WriteByte('-')
			}
			b.WriteRune(r)
			dash = false
		default:
			dash = true
		}
		if b.Len() >= 60 {
			break
		}
	}
	return b.String()
}

// DependencyCycle rejects a change whose edges (its references and its
// depends_on) would close a cycle of references/depends-on edges in the
// graph.
type DependencyCycle struct{ Graph Graph }

func (DependencyCycle) Name() string { return "dependency_cycle" }

func (c DependencyCycle) Check(ctx context.Context, in *Input) (Outcome, error) {
	req := in.Request
	edges := append(slices.Clone(req.GetReferences()), req.GetDependsOn()...)
	if in.Subject == "" || len(edges) == 0 || (req.GetAction() != ActionCreate && req.GetAction() != ActionModify) {
		return Outcome{}, nil
	}
	cycle, err := c.Graph.Cycle(ctx, in.Subject, edges)
	if err != nil || cycle == nil {
		return Outcome{}, err
	}
	// The field is the one holding the cycle's first edge, out of the
	// target.
	field := "references"
	if !slices.Contains(req.GetReferences(), cycle[1]) {
		field = "depends_on"
	}
	return Outcome{Verdict: Reject,
		Violations:  []*librarianv1.ViolationDetail{violation("circular_dependency", field, "error", "circular dependency detected: %s", strings.Join(cycle, " → "))},
		Suggestions: []string{"Review the dependency chain and drop or restructure a reference or dependency to avoid the cycle."}}, nil
}

// DeviationsAndRisk decides what a change that departs from the standards,
// or that its agent judges risky, needs: deviations are refused (strict
// mode) or escalated unless allow_deviations accepts them as constraints;
// a high or critical risk, or deleting a specification, goes to a human.
type DeviationsAndRisk struct{}

func (DeviationsAndRisk) Name() string { return "deviations_and_risk" }

var highRisk = regexp.MustCompile(`(?i)\b(high|critical|severe)\b`)

func (r DeviationsAndRisk) Check(_ context.Context, in *Input) (Outcome, error) {
	req := in.Request
	var out Outcome
	if devs := req.GetDeviations(); len(devs) > 0 {
		descriptions := make([]string, 0, len(devs))
		for _, d := range devs {
			descriptions = append(descriptions, describeDeviation(d.AsMap()))
		}
		c := in.Protocol.Compliance
		switch {
		case c.AllowDeviations:
			for _, d := range descriptions {
				out.Constraints = append(out.Constraints, "Accepted deviation, to be documented with the change: "+d)
			}
		case c.StrictMode:
			out.Verdict = Reject
			for _, d := range descriptions {
				out.Violations = append(out.Violations, violation("deviations_not_allowed", "deviations", "error", "deviation not allowed: %s", d))
			}
			out.Suggestions = append(out.Suggestions, "Change the proposal to follow the standards, or ask for allow_deviations.")
			return out, nil
		default:
			return Outcome{Verdict: Escalate, Reason: "the request departs from the standards: " + strings.Join(descriptions, "; ")}, nil
		}
	}
	if highRisk.MatchString(req.GetRiskAssessment()) {
		return Outcome{Verdict: Escalate, Reason: "the agent assessed the risk as: " + clip(req.GetRiskAssessment()), Constraints: out.Constraints}, nil
	}
	if req.GetRequestType() == TypeApproval && req.GetAction() == ActionDelete && (req.GetTargetType() == "architecture" || req.GetTargetType() == "design") {
		return Outcome{Verdict: Escalate, Reason: "deleting a " + req.GetTargetType() + " specification needs a human decision", Constraints: out.Constraints}, nil
	}
	return out, nil
}

func describeDeviation(m map[string]any) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%v", clip(k), clip(fmt.Sprint(m[k]))))
	}
	return strings.Join(parts, ", ")
}

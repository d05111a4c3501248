// Package observability holds the dashboards and alert rules that ship with
// Conclave. This test parses them as Grafana and Prometheus would, and
// checks that every Conclave metric they use is documented in
// docs/metrics.md (and so exported and tested by its service).
//
// It is its own module, outside go.work: Prometheus' rule and PromQL
// parsers come with a build list that must not reach the services.
package observability

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

var docRow = regexp.MustCompile("^\\|\\s*`(conclave_[a-z0-9_]+)`\\s*\\|\\s*([a-z]+)")

// documented reads docs/metrics.md: metric name → type.
func documented(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, metrics := range byService(t) {
		for name, typ := range metrics {
			out[name] = typ
		}
	}
	return out
}

// byService reads docs/metrics.md's tables: service (its "## " heading) →
// metric name → type.
func byService(t *testing.T) map[string]map[string]string {
	t.Helper()
	b, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]string{}
	service := ""
	for _, line := range strings.Split(string(b), "\n") {
		if h, ok := strings.CutPrefix(line, "## "); ok {
			service = strings.TrimSpace(h)
			continue
		}
		if m := docRow.FindStringSubmatch(line); m != nil && service != "" {
			if out[service] == nil {
				out[service] = map[string]string{}
			}
			out[service][m[1]] = m[2]
		}
	}
	if len(out) == 0 {
		t.Fatal("docs/metrics.md lists no metric")
	}
	return out
}

var promql = parser.NewParser(parser.Options{})

// metricsIn returns the Conclave metrics a PromQL expression reads, with a
// histogram's _bucket, _sum and _count series named by the histogram.
func metricsIn(t *testing.T, expr string, docs map[string]string) []string {
	t.Helper()
	e, err := promql.ParseExpr(expr)
	if err != nil {
		t.Errorf("PromQL %q: %v", expr, err)
		return nil
	}
	var out []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok || !strings.HasPrefix(vs.Name, "conclave_") {
			return nil
		}
		name := vs.Name
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base := strings.TrimSuffix(name, suffix); base != name && docs[base] == "histogram" {
				name = base
			}
		}
		out = append(out, name)
		return nil
	})
	return out
}

func TestRulesParseAndUseDocumentedMetrics(t *testing.T) {
	t.Parallel()
	docs := documented(t)
	files, _ := filepath.Glob("rules/*.yaml")
	if len(files) == 0 {
		t.Fatal("no rules files")
	}
	for _, f := range files {
		groups, errs := rulefmt.ParseFile(f, false, model.UTF8Validation, promql, slog.New(slog.DiscardHandler))
		for _, err := range errs {
			t.Errorf("%s: %v", f, err)
		}
		if groups == nil {
			continue
		}
		alerts := 0
		for _, g := range groups.Groups {
			for _, r := range g.Rules {
				alerts++
				for _, m := range metricsIn(t, r.Expr, docs) {
					if _, ok := docs[m]; !ok {
						t.Errorf("%s: alert %s uses %s, which docs/metrics.md does not list", f, r.Alert, m)
					}
				}
				if r.Annotations["summary"] == "" || r.Labels["severity"] == "" {
					t.Errorf("%s: alert %s needs a summary and a severity", f, r.Alert)
				}
			}
		}
		if alerts == 0 {
			t.Errorf("%s has no alerts", f)
		}
	}
}

// The alerts docs/metrics.md names exist in the rules.
func TestDocumentedAlertsExist(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	var alerts []string
	files, _ := filepath.Glob("rules/*.yaml")
	for _, f := range files {
		groups, _ := rulefmt.ParseFile(f, false, model.UTF8Validation, promql, slog.New(slog.DiscardHandler))
		for _, g := range groups.Groups {
			for _, r := range g.Rules {
				alerts = append(alerts, r.Alert)
			}
		}
	}
	for _, name := range regexp.MustCompile(`\bConclave[A-Za-z]+\b`).FindAllString(string(b), -1) {
		if !slices.Contains(alerts, name) {
			t.Errorf("docs/metrics.md names alert %s, which no rules file defines", name)
		}
	}
}

type dashboard struct {
	Title  string `json:"title"`
	UID    string `json:"uid"`
	Panels []struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

func TestDashboardsParseAndUseDocumentedMetrics(t *testing.T) {
	t.Parallel()
	docs := documented(t)
	files, _ := filepath.Glob("dashboards/*.json")
	if len(files) == 0 {
		t.Fatal("no dashboards")
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var d dashboard
		dec := json.NewDecoder(strings.NewReader(string(b)))
		if err := dec.Decode(&d); err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if d.Title == "" || d.UID == "" || len(d.Panels) == 0 {
			t.Errorf("%s: a dashboard needs a title, a uid and panels", f)
		}
		for _, p := range d.Panels {
			if len(p.Targets) == 0 {
				t.Errorf("%s: panel %q has no query", f, p.Title)
			}
			for _, tg := range p.Targets {
				for _, m := range metricsIn(t, tg.Expr, docs) {
					if _, ok := docs[m]; !ok {
						t.Errorf("%s: panel %q uses %s, which docs/metrics.md does not list", f, p.Title, m)
					}
				}
			}
		}
	}
}

// Every service in docs/metrics.md has a dashboard, dashboards/<service>.json,
// that shows every one of its metrics.
func TestEveryServiceDashboardShowsEveryMetric(t *testing.T) {
	t.Parallel()
	docs := documented(t)
	for service, metrics := range byService(t) {
		b, err := os.ReadFile(filepath.Join("dashboards", service+".json"))
		if err != nil {
			t.Errorf("%s has metrics but no dashboard: %v", service, err)
			continue
		}
		var d dashboard
		if err := json.Unmarshal(b, &d); err != nil {
			t.Errorf("dashboards/%s.json: %v", service, err)
			continue
		}
		shown := map[string]bool{}
		for _, p := range d.Panels {
			for _, tg := range p.Targets {
				for _, m := range metricsIn(t, tg.Expr, docs) {
					shown[m] = true
				}
			}
		}
		for name := range metrics {
			if !shown[name] {
				t.Errorf("the %s dashboard does not show %s", service, name)
			}
		}
	}
}

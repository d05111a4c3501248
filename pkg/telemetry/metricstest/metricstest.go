// Package metricstest reads a deployable's /metrics the way Prometheus
// does, for tests that drive an event and check that its metric moved, and
// reads docs/metrics.md, so that a test can check every documented metric
// is covered.
package metricstest

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Families is one scrape, parsed by Prometheus' own text parser.
type Families map[string]*dto.MetricFamily

// Scrape fetches url (a /metrics endpoint) and parses it.
func Scrape(t testing.TB, url string) Families {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape %s: %s", url, resp.Status)
	}
	return parse(t, resp.Body)
}

// ScrapeHandler serves one request to h, a metrics handler, and parses it.
func ScrapeHandler(t testing.TB, h http.Handler) Families {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("metrics handler answered %d", rec.Code)
	}
	return parse(t, rec.Body)
}

func parse(t testing.TB, r io.Reader) Families {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		t.Fatalf("metrics are not valid Prometheus text: %v", err)
	}
	return fams
}

// Value sums the samples of metric name whose labels include every
// name=value pair in labels: a counter's or gauge's value, or a histogram's
// count of observations. It is 0 for a metric with no matching sample.
func (f Families) Value(name string, labels ...string) float64 {
	fam, ok := f[name]
	if !ok {
		return 0
	}
	var sum float64
	for _, m := range fam.GetMetric() {
		if !matches(m, labels) {
			continue
		}
		switch {
		case m.GetCounter() != nil:
			sum += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			sum += m.GetGauge().GetValue()
		case m.GetHistogram() != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		case m.GetUntyped() != nil:
			sum += m.GetUntyped().GetValue()
		}
	}
	return sum
}

// Has reports whether metric name is exposed at all.
func (f Families) Has(name string) bool { _, ok := f[name]; return ok }

// Series counts the samples (label combinations) of every metric whose name
// starts with prefix: a histogram counts once per label set.
func (f Families) Series(prefix string) int {
	n := 0
	for name, fam := range f {
		if strings.HasPrefix(name, prefix) {
			n += len(fam.GetMetric())
		}
	}
	return n
}

// LabelValues lists the values label takes on metric name.
func (f Families) LabelValues(name, label string) []string {
	var out []string
	for _, m := range f[name].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == label && !slices.Contains(out, l.GetValue()) {
				out = append(out, l.GetValue())
			}
		}
	}
	slices.Sort(out)
	return out
}

func matches(m *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// Doc is a metric's row in docs/metrics.md.
type Doc struct {
	Name, Type, Labels, Meaning, Alert string
}

var docRow = regexp.MustCompile("^\\|\\s*`([a-z0-9_]+)`\\s*\\|([^|]*)\\|([^|]*)\\|([^|]*)\\|([^|]*)\\|")

// Documented reads the metrics docs/metrics.md lists under the heading
// "## <service>", found from the working directory upwards.
func Documented(t testing.TB, service string) []Doc {
	t.Helper()
	path := docsPath(t)
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	defer f.Close()
	var out []Doc
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			in = strings.TrimSpace(strings.TrimPrefix(line, "## ")) == service
			continue
		}
		if m := docRow.FindStringSubmatch(line); in && m != nil {
			out = append(out, Doc{Name: m[1], Type: strings.TrimSpace(m[2]), Labels: strings.TrimSpace(m[3]),
				Meaning: strings.TrimSpace(m[4]), Alert: strings.TrimSpace(m[5])})
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	if len(out) == 0 {
		t.Fatalf("%s lists no metrics under \"## %s\"", path, service)
	}
	return out
}

// DocumentedNames is Documented's metric names.
func DocumentedNames(t testing.TB, service string) []string {
	t.Helper()
	var names []string
	for _, d := range Documented(t, service) {
		names = append(names, d.Name)
	}
	return names
}

func docsPath(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		p := filepath.Join(dir, "docs", "metrics.md")
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return p
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("metricstest: no go.work above the working directory")
		}
		dir = parent
	}
}

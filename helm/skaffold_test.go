package helm

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// skaffoldConfig is the part of skaffold's v4 schema skaffold.yaml uses;
// decoding it strictly fails on a misspelt or misplaced field.
type skaffoldConfig struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Build struct {
		TagPolicy map[string]any `json:"tagPolicy"`
		Local     struct {
			UseBuildkit bool `json:"useBuildkit"`
		} `json:"local"`
		Artifacts []struct {
			Image   string `json:"image"`
			Context string `json:"context"`
			Docker  struct {
				Dockerfile string `json:"dockerfile"`
			} `json:"docker"`
		} `json:"artifacts"`
	} `json:"build"`
	Deploy struct {
		Helm struct {
			Releases []struct {
				Name              string            `json:"name"`
				ChartPath         string            `json:"chartPath"`
				Namespace         string            `json:"namespace"`
				CreateNamespace   bool              `json:"createNamespace"`
				Wait              bool              `json:"wait"`
				SetValueTemplates map[string]string `json:"setValueTemplates"`
			} `json:"releases"`
		} `json:"helm"`
	} `json:"deploy"`
	Profiles []struct {
		Name    string `json:"name"`
		Patches []struct {
			Op    string `json:"op"`
			Path  string `json:"path"`
			Value any    `json:"value"`
		} `json:"patches"`
	} `json:"profiles"`
}

// TestSkaffold checks skaffold.yaml against the Dockerfiles and the chart:
// one artifact per image the chart runs (the deployables, agent-host and
// the example agent) built from its Dockerfile with the repository root as
// context, its image handed to the chart's value for it, and profiles dev
// and aws selecting values files that exist.
func TestSkaffold(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	data, err := os.ReadFile(filepath.Join(root, "skaffold.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg skaffoldConfig
	if err := yaml.UnmarshalStrict(data, &cfg); err != nil {
		t.Fatalf("skaffold.yaml: %v", err)
	}
	if !regexp.MustCompile(`^skaffold/v4beta[0-9]+$`).MatchString(cfg.APIVersion) || cfg.Kind != "Config" {
		t.Errorf("skaffold.yaml is %s %s, want a skaffold/v4 Config", cfg.APIVersion, cfg.Kind)
	}

	values := chartValues(t)
	if len(cfg.Deploy.Helm.Releases) != 1 {
		t.Fatalf("%d Helm releases, want 1", len(cfg.Deploy.Helm.Releases))
	}
	rel := cfg.Deploy.Helm.Releases[0]
	if _, err := os.Stat(filepath.Join(root, rel.ChartPath, "Chart.yaml")); err != nil {
		t.Errorf("release %s: chartPath %s is no chart: %v", rel.Name, rel.ChartPath, err)
	}

	var built, want, imageValues []string
	for _, img := range dockerImages {
		if img.values != "" {
			want = append(want, img.name)
			imageValues = append(imageValues, img.values)
		}
	}
	for _, a := range cfg.Build.Artifacts {
		if a.Context != "." {
			t.Errorf("artifact %s: context %q, want the repository root", a.Image, a.Context)
		}
		df := a.Docker.Dockerfile
		if _, err := os.Stat(filepath.Join(root, df)); err != nil {
			t.Errorf("artifact %s: %v", a.Image, err)
		}
		i := slices.IndexFunc(dockerImages, func(img dockerImage) bool { return img.dockerfile == df })
		if i < 0 || dockerImages[i].values == "" {
			t.Errorf("artifact %s builds %s, the Dockerfile of no image the chart runs", a.Image, df)
			continue
		}
		img := dockerImages[i]
		built = append(built, img.name)
		// Skaffold's template names: "/" and "-" in the image become "_".
		key := strings.NewReplacer("/", "_", "-", "_").Replace(a.Image)
		for value, want := range map[string]string{
			img.values + ".repository": "{{.IMAGE_REPO_" + key + "}}",
			img.values + ".tag":        "{{.IMAGE_TAG_" + key + "}}",
		} {
			if got := rel.SetValueTemplates[value]; got != want {
				t.Errorf("setValueTemplates[%s] = %q, want %q", value, got, want)
			}
		}
		if repo := valueAt(values, img.values+".repository"); repo != a.Image {
			t.Errorf("the chart's %s.repository is %v, skaffold builds %s", img.values, repo, a.Image)
		}
	}
	slices.Sort(built)
	slices.Sort(want)
	if !slices.Equal(built, want) {
		t.Errorf("skaffold builds %v, want one artifact per image the chart runs %v", built, want)
	}
	for key := range rel.SetValueTemplates {
		if !slices.ContainsFunc(imageValues, func(v string) bool { return strings.HasPrefix(key, v+".") }) {
			t.Errorf("setValueTemplates sets %s, no image's value", key)
		}
	}

	profiles := map[string]string{}
	for _, p := range cfg.Profiles {
		for _, patch := range p.Patches {
			if patch.Path != "/deploy/helm/releases/0/valuesFiles" {
				continue
			}
			files, _ := patch.Value.([]any)
			for _, f := range files {
				path, _ := f.(string)
				if _, err := os.Stat(filepath.Join(root, path)); err != nil {
					t.Errorf("profile %s: values file: %v", p.Name, err)
				}
				profiles[p.Name] = path
			}
		}
	}
	for name, file := range map[string]string{"dev": "helm/conclave/values-dev.yaml", "aws": "helm/conclave/values-aws.yaml"} {
		if profiles[name] != file {
			t.Errorf("profile %s uses values %q, want %s", name, profiles[name], file)
		}
	}
}

// valueAt is the value at a dotted path of values, or nil.
func valueAt(values map[string]any, path string) any {
	var v any = values
	for _, key := range strings.Split(path, ".") {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[key]
	}
	return v
}

// chartValues reads the chart's default values.
func chartValues(t *testing.T) map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := yaml.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

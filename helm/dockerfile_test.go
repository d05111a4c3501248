package helm

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// deployables are the services that run on Kubernetes: each has a Dockerfile,
// a skaffold artifact and a section of the chart's values.
var deployables = []string{"gateway", "bus", "runner", "console"}

// storeDeployables are the deployables with state of their own (DynamoDB
// and SQS, or the embedded store): the console keeps only memory, takes no
// storage settings and needs no AWS role.
var storeDeployables = []string{"gateway", "bus", "runner"}

// dockerImage is an image built from a Dockerfile in this repository.
type dockerImage struct {
	name       string // conclave/<name>
	dockerfile string // relative to the repository root, the build context
	pkg        string // the main package it builds
	// values is the chart's value naming the image (<values>.repository,
	// .tag), which skaffold sets to what it built; "" for an image the
	// chart does not run (skaffold does not build it).
	values string
	// numericUser: the runner's Kubernetes executor runs it, whose pods set
	// runAsNonRoot without a runAsUser, so the kubelet must see a numeric
	// non-root USER (the chart sets the deployables' runAsUser itself).
	numericUser bool
}

// dockerImages are every image with a Dockerfile: the deployables,
// agent-host (the executor's init container) and the example agent.
var dockerImages = func() []dockerImage {
	var images []dockerImage
	for _, d := range deployables {
		images = append(images, dockerImage{name: d, dockerfile: "services/" + d + "/Dockerfile", pkg: "./services/" + d + "/cmd/" + d, values: d + ".image"})
	}
	return append(images,
		dockerImage{name: "agent-host", dockerfile: "services/runner/Dockerfile.agent-host", pkg: "./services/runner/cmd/agent-host", values: "agentHost.image", numericUser: true},
		dockerImage{name: "acp-agent", dockerfile: "examples/acp-agent/Dockerfile", pkg: "./examples/acp-agent", values: "exampleAgent.image", numericUser: true},
	)
}()

// repoRoot is the repository root, one directory above this module.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// goWorkVersion reads the go directive of go.work, the toolchain every image
// must build with.
func goWorkVersion(t *testing.T) string {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot(t), "go.work"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "go "); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatal("go.work has no go directive")
	return ""
}

// dockerfile is what the checks need of a Dockerfile: its stages' base images
// and the instructions of each, with continuation lines joined.
type dockerfile struct {
	stages []stage
}

type stage struct {
	from         string
	instructions []string // "RUN go build ...", "USER nonroot:nonroot", ...
}

func parseDockerfile(t *testing.T, path string) dockerfile {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var df dockerfile
	var line strings.Builder
	for raw := range strings.SplitSeq(string(data), "\n") {
		trimmed := strings.TrimSpace(raw)
		if line.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if cont, ok := strings.CutSuffix(trimmed, "\\"); ok {
			line.WriteString(cont + " ")
			continue
		}
		line.WriteString(trimmed)
		ins := line.String()
		line.Reset()
		if from, ok := strings.CutPrefix(ins, "FROM "); ok {
			image := strings.Fields(from)[0]
			df.stages = append(df.stages, stage{from: image})
			continue
		}
		if len(df.stages) == 0 {
			if strings.HasPrefix(ins, "ARG ") {
				continue
			}
			t.Fatalf("%s: %q before the first FROM", path, ins)
		}
		last := &df.stages[len(df.stages)-1]
		last.instructions = append(last.instructions, ins)
	}
	if len(df.stages) < 2 {
		t.Fatalf("%s: %d stages, want a build stage and a final one", path, len(df.stages))
	}
	return df
}

var goBuildPackage = regexp.MustCompile(`go build .*\s(\./\S+)$`)

// TestDockerfiles checks each Dockerfile as far as can be done without
// Docker: the toolchain is go.work's, the build is static, trimmed and
// honours SKAFFOLD_GO_GCFLAGS, the package built is the image's main
// package, and the final image is distroless static running as non-root.
func TestDockerfiles(t *testing.T) {
	root := repoRoot(t)
	goVersion := goWorkVersion(t)
	for _, img := range dockerImages {
		t.Run(img.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(root, img.dockerfile)
			df := parseDockerfile(t, path)
			build, final := df.stages[0], df.stages[len(df.stages)-1]

			if want := "golang:" + goVersion; !strings.HasPrefix(build.from, want+"-") && build.from != want {
				t.Errorf("build stage FROM %s, want the toolchain of go.work (%s)", build.from, want)
			}
			all := strings.Join(build.instructions, "\n")
			if !regexp.MustCompile(`(?m)^ENV .*\bCGO_ENABLED=0\b`).MatchString(all) {
				t.Errorf("build stage does not set CGO_ENABLED=0")
			}
			if !regexp.MustCompile(`(?m)^ENV .*\bGOTOOLCHAIN=local\b`).MatchString(all) {
				t.Errorf("build stage does not set GOTOOLCHAIN=local (the go command could fetch another toolchain)")
			}
			if !strings.Contains(all, "ARG SKAFFOLD_GO_GCFLAGS") {
				t.Errorf("build stage does not declare ARG SKAFFOLD_GO_GCFLAGS")
			}
			var pkg string
			for _, ins := range build.instructions {
				if !strings.HasPrefix(ins, "RUN ") || !strings.Contains(ins, "go build") {
					continue
				}
				if !strings.Contains(ins, " -trimpath") {
					t.Errorf("go build without -trimpath: %s", ins)
				}
				if !strings.Contains(ins, `-gcflags="${SKAFFOLD_GO_GCFLAGS}"`) {
					t.Errorf(`go build without -gcflags="${SKAFFOLD_GO_GCFLAGS}": %s`, ins)
				}
				if m := goBuildPackage.FindStringSubmatch(ins); m != nil {
					pkg = m[1]
				}
			}
			if pkg != img.pkg {
				t.Fatalf("go build builds %q, want %q", pkg, img.pkg)
			}
			if !isMainPackage(t, filepath.Join(root, pkg)) {
				t.Errorf("%s is not a main package", pkg)
			}

			if final.from != "gcr.io/distroless/static-debian12:nonroot" {
				t.Errorf("final stage FROM %s, want gcr.io/distroless/static-debian12:nonroot", final.from)
			}
			var user string
			for _, ins := range final.instructions {
				if u, ok := strings.CutPrefix(ins, "USER "); ok {
					user = strings.TrimSpace(u)
				}
			}
			if user == "" || strings.HasPrefix(user, "root") || strings.HasPrefix(user, "0") {
				t.Errorf("final stage runs as %q, want a non-root USER", user)
			}
			if img.numericUser && !regexp.MustCompile(`^[1-9][0-9]*(:[0-9]+)?$`).MatchString(user) {
				t.Errorf("final stage runs as %q, want a numeric non-root USER (the Kubernetes executor's pods check runAsNonRoot)", user)
			}
		})
	}
}

// isMainPackage reports whether dir holds Go files of package main.
func isMainPackage(t *testing.T, dir string) bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if regexp.MustCompile(`(?m)^package main\b`).Match(data) {
			return true
		}
	}
	return false
}

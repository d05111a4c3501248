package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// GoBuild builds main packages of this workspace, for tests that run them
// as processes, the way the images build them (deploy/images): static
// (CGO_ENABLED=0), -trimpath, with the repository's go.work. pkgs are
// import paths or paths relative to the repository root
// ("./cmd/conclave"); out is go build's -o: the binary's path for one
// package, a directory (ending in a separator) for several.
//
// Every test builds with these settings, so that the packages compile once
// for all of them: each other combination of cgo and -trimpath compiles
// every dependency again, some 500 CPU-seconds of a fresh machine's
// `make test` (docs/testing.md).
func GoBuild(ctx context.Context, out string, pkgs ...string) error {
	return GoBuildTags(ctx, nil, out, pkgs...)
}

// GoBuildTemp is GoBuild into a new temporary directory named for pattern
// (as os.MkdirTemp names it), for a package's TestMain: each package's
// binary is dir/<its last path element>. remove deletes the directory.
func GoBuildTemp(ctx context.Context, pattern string, pkgs ...string) (dir string, remove func(), err error) {
	dir, err = os.MkdirTemp("", pattern)
	if err != nil {
		return "", nil, err
	}
	remove = func() { _ = os.RemoveAll(dir) }
	if err := GoBuild(ctx, dir+string(filepath.Separator), pkgs...); err != nil {
		remove()
		return "", nil, err
	}
	return dir, remove, nil
}

// GoBuildTags is GoBuild with build tags, such as the Librarian's
// lambda.norpc.
func GoBuildTags(ctx context.Context, tags []string, out string, pkgs ...string) error {
	root, err := RepoRoot()
	if err != nil {
		return err
	}
	dir := out
	if !strings.HasSuffix(out, string(filepath.Separator)) {
		dir = filepath.Dir(out)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	args := []string{"build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w"}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	args = append(args, "-o", out)
	cmd := exec.CommandContext(ctx, "go", append(args, pkgs...)...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK="+filepath.Join(root, "go.work"))
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("testenv: go build %s: %w\n%s", strings.Join(pkgs, " "), err, b)
	}
	return nil
}

// ConclaveImages builds the named images of deploy/images (gateway, bus,
// runner, console, agent-host, acp-agent, ...) for this machine's
// architecture into dir, as `make images` does (conclave-images), and
// returns their docker-save tarballs, in the order named, for
// KubeNode.ImportImage. Their binaries build as GoBuild's do.
func ConclaveImages(ctx context.Context, dir string, names ...string) ([]string, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	tool := filepath.Join(dir, "conclave-images")
	build := exec.CommandContext(ctx, "go", "build", "-o", tool, "./cmd/conclave-images")
	build.Dir = filepath.Join(root, "deploy", "images")
	build.Env = append(os.Environ(), "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("testenv: go build conclave-images: %w\n%s", err, out)
	}
	out := filepath.Join(dir, "images")
	run := exec.CommandContext(ctx, tool, append([]string{"-root", root, "-out", out, "-arch", runtime.GOARCH}, names...)...)
	if output, err := run.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("testenv: conclave-images: %w\n%s", err, output)
	}
	tarballs := make([]string, len(names))
	for i, n := range names {
		tarballs[i] = filepath.Join(out, n+".tar")
	}
	return tarballs, nil
}

package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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

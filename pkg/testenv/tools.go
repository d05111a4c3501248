package testenv

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// toolsMu serialises tool builds within a test binary; the script itself
// serialises them across test binaries.
var toolsMu sync.Mutex

// ToolBinaries makes sure the binaries of the tools/<module> module are in
// .cache/bin and built from its current go.mod and go.sum, running
// scripts/build-test-tools.sh <module> otherwise, and returns .cache/bin.
func ToolBinaries(ctx context.Context, module string, names ...string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(root, ".cache", "bin")
	toolsMu.Lock()
	defer toolsMu.Unlock()
	current, err := toolsUpToDate(root, bin, module, names)
	if err != nil || current {
		return bin, err
	}
	start := time.Now()
	fmt.Fprintf(os.Stderr, "testenv: building the %s test tools (once; this takes minutes)\n", module)
	cmd := exec.CommandContext(ctx, filepath.Join(root, "scripts", "build-test-tools.sh"), module)
	cmd.Dir = root
	// Its own process group, so cancelling ctx also ends the go build under it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	out := &LockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("testenv: scripts/build-test-tools.sh %s: %v\n%s", module, err, out)
	}
	fmt.Fprintf(os.Stderr, "testenv: built the %s test tools in %s\n", module, time.Since(start).Round(time.Second))
	return bin, nil
}

// toolsUpToDate reports whether every named binary exists and the module's
// stamp, written by the build script, matches its go.mod and go.sum.
func toolsUpToDate(root, bin, module string, names []string) (bool, error) {
	for _, n := range names {
		if _, err := os.Stat(filepath.Join(bin, n)); errors.Is(err, os.ErrNotExist) {
			return false, nil
		} else if err != nil {
			return false, err
		}
	}
	h := sha256.New()
	for _, f := range []string{"go.mod", "go.sum"} {
		b, err := os.ReadFile(filepath.Join(root, "tools", module, f))
		if err != nil {
			return false, fmt.Errorf("testenv: tools module %s: %w", module, err)
		}
		h.Write(b)
	}
	stamp, err := os.ReadFile(filepath.Join(bin, ".stamp-"+module))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	return strings.TrimSpace(string(stamp)) == hex.EncodeToString(h.Sum(nil)), nil
}

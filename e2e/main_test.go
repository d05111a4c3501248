package e2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

// The real parts every shape shares: one Jaeger, and the repository's
// binaries, built once (binaries).
var (
	jaeger *testenv.Jaeger
	// repoRoot is the workspace root: the binaries are built from it, and
	// the example tool agents are read from it.
	repoRoot string
	binDir   string
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	flag.Parse()
	if testing.Short() {
		return m.Run()
	}
	var err error
	if repoRoot, err = testenv.RepoRoot(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if binDir, err = os.MkdirTemp("", "conclave-e2e-bin"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(binDir)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if jaeger, err = testenv.StartJaeger(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer jaeger.Stop()
	return m.Run()
}

var built struct {
	sync.Mutex
	bins map[string]string
}

// binaries builds those of the main packages (paths from the repository
// root, "./cmd/conclave") not built yet, in one `go build` so that both
// cores compile their shared packages once, and returns every package's
// binary by its path.
func binaries(t *testing.T, pkgs ...string) map[string]string {
	t.Helper()
	built.Lock()
	defer built.Unlock()
	if built.bins == nil {
		built.bins = map[string]string{}
	}
	var missing []string
	for _, p := range pkgs {
		if built.bins[p] == "" {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		if err := testenv.GoBuild(t.Context(), binDir+string(filepath.Separator), missing...); err != nil {
			t.Fatal(err)
		}
		for _, p := range missing {
			built.bins[p] = filepath.Join(binDir, path.Base(p))
		}
	}
	out := make(map[string]string, len(pkgs))
	for _, p := range pkgs {
		out[p] = built.bins[p]
	}
	return out
}

package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

// readmeSection returns the README's text from heading to the next heading
// of its level.
func readmeSection(t *testing.T, readme, heading string) string {
	t.Helper()
	i := strings.Index(readme, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("README.md has no %q section", heading)
	}
	rest := readme[i+len(heading)+2:]
	if j := strings.Index(rest, "\n## "); j >= 0 {
		rest = rest[:j]
	}
	return rest
}

// fencedBlocks returns the fenced code blocks of text, each as its lines.
func fencedBlocks(text string) [][]string {
	var blocks [][]string
	var cur []string
	in := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "```") {
			if in {
				blocks = append(blocks, cur)
				cur = nil
			}
			in = !in
			continue
		}
		if in {
			cur = append(cur, line)
		}
	}
	return blocks
}

// TestReadmeQuickStart follows the README's quick start as a new user
// would: conclave dev prints the endpoint table the README shows, and each
// command of its "try each service" block succeeds against it, the
// example agent leaving its notes.txt. The README cannot drift from what
// the binary does.
func TestReadmeQuickStart(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: runs conclave dev")
	}
	t.Parallel()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := fencedBlocks(readmeSection(t, string(readme), "## Quick start"))
	if len(blocks) != 3 {
		t.Fatalf("the quick start has %d code blocks, want 3: the two commands, the endpoint table, the commands to try", len(blocks))
	}
	var makeTargets []string
	for _, line := range blocks[0] {
		makeTargets = append(makeTargets, strings.Fields(line)[:2]...)
	}
	if !slices.Equal(makeTargets, []string{"make", "run", "make", "test"}) {
		t.Errorf("the quick start's commands are %v, want make run and make test", makeTargets)
	}

	// conclave dev, run where the user's shell is: a workspace of its own.
	work := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d, err := testenv.StartDev(ctx, conclaveBin, work, []string{"--bridge-config=" + filepath.Join(root, "examples/tool-agents/config.yaml"), "--data-dir", filepath.Join(work, ".conclave")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Kill)
	var shown []string
	for _, line := range blocks[1] {
		if row, _, ok := testenv.DevTableRow(line); ok {
			shown = append(shown, row)
		}
	}
	var printed []string
	for row := range d.Addrs() {
		printed = append(printed, row)
	}
	slices.Sort(shown)
	slices.Sort(printed)
	if !slices.Equal(shown, printed) {
		t.Errorf("the README's endpoint table has rows %v, conclave dev prints %v", shown, printed)
	}

	// Each command, told where this dev listens (the README's run on the
	// default addresses): the flag goes right after the command's name.
	where := map[string][]string{
		"agent":     {"--addr", d.Addr("gateway gRPC")},
		"runner":    {"--url", "http://" + d.Addr("runner HTTP")},
		"librarian": {"--url", "http://" + d.Addr("librarian HTTP")},
		"bus":       {"--url", "ws://" + d.Addr("bus WebSocket")},
		"bridge":    nil,
	}
	for _, line := range blocks[2] {
		if line = strings.TrimSpace(line); line == "" {
			continue
		}
		words, err := shellWords(line, work)
		if err != nil {
			t.Fatalf("README line %q: %v", line, err)
		}
		if words[0] != "bin/conclave" || len(words) < 3 {
			t.Fatalf("README line %q: want bin/conclave COMMAND SUBCOMMAND ...", line)
		}
		flags, ok := where[words[1]]
		if !ok {
			t.Fatalf("README line %q: the test does not know where %q's service listens", line, words[1])
		}
		// The README's paths are the repository's, its shell at the root.
		for i, w := range words {
			if strings.HasPrefix(w, "examples/") {
				words[i] = filepath.Join(root, w)
			}
		}
		args := slices.Concat(words[1:3], flags, words[3:])
		cmd := exec.CommandContext(ctx, conclaveBin, args...)
		cmd.Dir = work
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Errorf("README line %q (run as conclave %s): %v\n%s", line, strings.Join(args, " "), err, out.String())
		}
	}
	testenv.Eventually(t, time.Minute, "the example agent's notes.txt in the workspace", func() bool {
		_, err := os.Stat(filepath.Join(work, "notes.txt"))
		return err == nil
	})
}

// shellWords splits a README command line as sh would for the forms the
// README uses: words, "double-quoted strings" with $PWD (given as pwd: the
// user's shell is at the repository's root, which conclave dev started in
// takes as its workspace; the test's dev runs in a directory of its own),
// and a trailing # comment.
func shellWords(line, pwd string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord, quoted := false, false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case quoted && c == '"':
			quoted = false
		case quoted:
			cur.WriteByte(c)
		case c == '"':
			quoted, inWord = true, true
		case c == '#' && !inWord:
			i = len(line)
		case c == ' ' || c == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if quoted {
		return nil, errUnterminated
	}
	if inWord {
		words = append(words, cur.String())
	}
	for i, w := range words {
		words[i] = strings.ReplaceAll(w, "$PWD", pwd)
	}
	return words, nil
}

var errUnterminated = errors.New("an unterminated double quote")

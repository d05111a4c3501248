package service_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/conclave-ai/conclave/functions/librarian/config"
)

// writeConfig writes the built-in agents.yaml and protocol.yaml into dir,
// with old replaced by new in protocol.yaml.
func writeConfig(t *testing.T, dir, old, new string) {
	t.Helper()
	for _, f := range []string{"agents.yaml", "protocol.yaml"} {
		b, err := config.Files.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		if f == "protocol.yaml" {
			if !strings.Contains(text, old) {
				t.Fatalf("protocol.yaml has no %q", old)
			}
			text = strings.Replace(text, old, new, 1)
		}
		if err := os.WriteFile(filepath.Join(dir, f), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

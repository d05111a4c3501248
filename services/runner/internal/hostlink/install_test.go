package hostlink

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// The copy is whole, executable by anyone, and runs.
func TestInstall(t *testing.T) {
	// Not parallel: running a file just written while another test forks
	// can fail with "text file busy".
	src, err := exec.LookPath("true")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	dest := filepath.Join(dir, "agent-host")
	// Over a stale copy, as a restarted init container would find.
	if err := os.WriteFile(dest, []byte("stale"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Install(src, dest); err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(src)
	got, _ := os.ReadFile(dest)
	if !bytes.Equal(got, want) {
		t.Error("the copy differs from the source")
	}
	info, err := os.Stat(dest)
	if err != nil || info.Mode().Perm() != 0o755 {
		t.Errorf("mode %v, %v; want 0755", info.Mode(), err)
	}
	if err := exec.Command(dest).Run(); err != nil {
		t.Errorf("running the copy: %v", err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("left behind %v", entries)
	}
	for _, bad := range [][2]string{{filepath.Join(dir, "missing"), filepath.Join(dir, "x")}, {src, filepath.Join(dir, "no", "such", "dir")}} {
		if err := Install(bad[0], bad[1]); err == nil {
			t.Errorf("Install(%q, %q) succeeded", bad[0], bad[1])
		}
	}
}

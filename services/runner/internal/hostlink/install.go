package hostlink

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Install copies the executable src (agent-host's own,
// os.Executable) to dest, readable and executable by every user, for the
// init container's `agent-host install /conclave/bin/agent-host`: the
// agent-host image then needs no shell or cp, and the agent's container may
// run as another user than the init container. The copy is written beside
// dest and renamed over it, so dest is never a partial binary.
func Install(src, dest string) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("install agent-host: %w", err)
	}
	defer in.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dest), "."+filepath.Base(dest)+".*")
	if err != nil {
		return fmt.Errorf("install agent-host: %w", err)
	}
	defer os.Remove(tmp.Name()) // after a successful rename, there is nothing to remove
	if _, err := io.Copy(tmp, in); err != nil {
		tmp.Close()
		return fmt.Errorf("install agent-host: copying to %s: %w", dest, err)
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return fmt.Errorf("install agent-host: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("install agent-host: %w", err)
	}
	if err := os.Rename(tmp.Name(), dest); err != nil {
		return fmt.Errorf("install agent-host: %w", err)
	}
	return nil
}

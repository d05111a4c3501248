package testenv

import (
	"errors"
	"os/exec"
)

// Chromium finds Debian's Chromium, which scripts/install-test-deps.sh
// installs, for the tests that drive pages in a real browser (the
// Librarian's review page, the console).
func Chromium() (string, error) {
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", errors.New("chromium is not installed: run scripts/install-test-deps.sh")
}

// ChromiumFlags are the command-line flags every browser test runs Chromium
// with: headless, without a sandbox (tests run as root) or a GPU, and with
// nothing that would reach another host on its own (QUIC, background
// networking, component updates, sync). Give each run a fresh
// --user-data-dir besides.
func ChromiumFlags() map[string]any {
	return map[string]any{
		"headless":                      true,
		"no-sandbox":                    true,
		"disable-gpu":                   true,
		"disable-quic":                  true,
		"no-first-run":                  true,
		"disable-background-networking": true,
		"disable-component-update":      true,
		"disable-sync":                  true,
	}
}

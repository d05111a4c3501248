//go:build linux

package kubeenv

import "context"

// SetKubeNodeHostHooks has KubeNode call before right before it changes
// anything on the host, and Stop call after once it has undone it all,
// both under the machine-wide node lock (nil clears a hook).
func SetKubeNodeHostHooks(before, after func()) {
	kubeNodeHooks.beforeStart = before
	kubeNodeHooks.afterStop = after
}

// CleanStaleKubeNodes tears down, under the machine-wide node lock, what
// crashed test processes left, so that a test can snapshot the host as it
// is without them.
func CleanStaleKubeNodes(ctx context.Context) error {
	kubeNodeMu.Lock()
	defer kubeNodeMu.Unlock()
	lock, err := lockKubeNodes(ctx)
	if err != nil {
		return err
	}
	defer lock.Close()
	cleanStaleKubeNodes()
	return nil
}

// KubeNodeRoot is where nodes keep their state, for a test that plants a
// crashed node's leftovers there.
const KubeNodeRoot = kubeNodeRoot

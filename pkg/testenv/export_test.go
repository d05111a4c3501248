//go:build linux

package testenv

// SetKubeNodeHostHooks has KubeNode call before right before it changes
// anything on the host, and Stop call after once it has undone it all,
// both under the machine-wide node lock (nil clears a hook).
func SetKubeNodeHostHooks(before, after func()) {
	kubeNodeHooks.beforeStart = before
	kubeNodeHooks.afterStop = after
}

// KubeNodeRoot is where nodes keep their state, for a test that plants a
// crashed node's leftovers there.
const KubeNodeRoot = kubeNodeRoot

// Command pause is the pod sandbox's placeholder process in the images a
// KubeNode builds for itself (there is no registry to pull
// registry.k8s.io/pause from). It sleeps until SIGINT or SIGTERM and reaps
// orphaned children, as it is PID 1 when a pod shares its PID namespace.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			if pid, _ := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 {
				break
			}
		}
	}
}

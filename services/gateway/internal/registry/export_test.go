package registry

import "time"

// FreezeDeadEpochMemory stops the clock that ages the memory of dead epochs,
// so that a test can count lease reads without depending on its own speed.
func FreezeDeadEpochMemory(r *Registry) {
	at := time.Now()
	r.deadClock = func() time.Time { return at }
}

package queue

import "io"

// Opened is a Queue with the resources behind it, released by Close, as
// pkg/storage's OpenQueue returns it.
type Opened interface {
	Queue
	io.Closer
}

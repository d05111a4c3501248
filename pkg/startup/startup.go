// Package startup opens what a deployable's main needs before its service
// can be built: the logger, telemetry, the store with the service's
// tables, and the queue with its queues, in that order, from the settings
// every deployable shares. Each main (and `conclave dev`, which opens one
// store and queue for all) calls it rather than writing the sequence out.
package startup

import (
	"context"
	"errors"
	"io"
	"log/slog"

	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/storage"
	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/telemetry"
)

// Options say what a deployable opens.
type Options struct {
	// Name is the deployable's ("gateway"): its logs' service and, as
	// "conclave-<Name>", its traces' and metrics' service name.
	Name string
	// TelemetryName, when set, replaces "conclave-<Name>" as the service
	// name of its traces and metrics.
	TelemetryName string
	// Version is reported with its telemetry ("" for none).
	Version string
	Common  config.Common
	Storage config.Storage
	// Logs is where the logs go.
	Logs io.Writer
	// Tables are created in the store if they are missing.
	Tables []store.Table
	// Queue says whether the deployable uses a queue; Queues are created
	// in it if they are missing.
	Queue  bool
	Queues []queue.Definition
}

// Backends are what Open opened. Close releases them, in the reverse
// order.
type Backends struct {
	Logger    *slog.Logger
	Telemetry *telemetry.Provider
	Store     store.Store
	// Queue is nil unless Options.Queue.
	Queue queue.Queue

	closers []func()
}

// Open opens the logger, telemetry, store and queue that o names. On an
// error, what it had opened is closed again.
func Open(ctx context.Context, o Options) (_ *Backends, err error) {
	b := &Backends{Logger: o.Common.Logger(o.Logs, o.Name)}
	defer func() {
		if err != nil {
			b.Close()
		}
	}()
	name := o.TelemetryName
	if name == "" {
		name = "conclave-" + o.Name
	}
	tel, stopTelemetry, err := telemetry.Start(ctx, o.Common, name, o.Version)
	if err != nil {
		return nil, err
	}
	b.Telemetry = tel
	b.closers = append(b.closers, stopTelemetry)
	st, err := storage.OpenStore(ctx, o.Storage)
	if err != nil {
		return nil, err
	}
	b.Store = st
	b.closers = append(b.closers, func() { _ = st.Close() })
	if err := store.EnsureTables(ctx, st, o.Tables...); err != nil {
		return nil, err
	}
	if !o.Queue {
		if len(o.Queues) > 0 {
			return nil, errors.New("startup: queues named without Options.Queue")
		}
		return b, nil
	}
	q, err := storage.OpenQueue(ctx, o.Storage)
	if err != nil {
		return nil, err
	}
	b.Queue = q
	b.closers = append(b.closers, func() { _ = q.Close() })
	if err := queue.EnsureAll(ctx, q, o.Queues...); err != nil {
		return nil, err
	}
	return b, nil
}

// Close releases the backends: the queue, the store, then telemetry (which
// flushes what they reported as they closed).
func (b *Backends) Close() {
	for i := len(b.closers) - 1; i >= 0; i-- {
		b.closers[i]()
	}
	b.closers = nil
}

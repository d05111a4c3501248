// Command runner runs the ACP agent runner (Kandev's ACP and the Agent Client Protocol).
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/startup"
	eventsv1 "github.com/conclave-ai/conclave/proto/conclave/events/v1"
	"github.com/conclave-ai/conclave/services/runner/service"
)

type appConfig struct {
	config.Common
	Storage config.Storage
	Runner  service.Config
}

func main() { config.Main("runner", run) }

func run(ctx context.Context, args []string) error {
	var cfg appConfig
	if err := config.Load(ctx, &cfg, "runner", args, os.LookupEnv, os.Stderr); err != nil {
		return err
	}
	b, err := startup.Open(ctx, startup.Options{Name: "runner", Common: cfg.Common, Storage: cfg.Storage, Logs: os.Stderr,
		Tables: service.Tables, Queue: true, Queues: service.Queues(cfg.Runner)})
	if err != nil {
		return err
	}
	defer b.Close()
	r, err := service.New(cfg.Runner, service.Deps{Store: b.Store, Queue: b.Queue, Logger: b.Logger, Telemetry: b.Telemetry,
		ProcessDir:      filepath.Join(cfg.Storage.DataDir, service.ProcessDirName),
		BeforeEventSend: crashPoint(os.Getenv("CONCLAVE_RUNNER_TEST_CRASHPOINT"))})
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

// crashPoint is the hook of CONCLAVE_RUNNER_TEST_CRASHPOINT, for the tests
// that kill the runner at a chosen point (service/kill_test.go). With
// "before-terminal-event", the first event announcing a terminal status
// (completed, failed, stopped) is never sent: the runner writes
// "crashpoint before-terminal-event reached" to stderr and its event
// sender waits there for the test to kill the process. Unset: nil.
func crashPoint(name string) func(*eventsv1.Envelope) {
	if name != "before-terminal-event" {
		return nil
	}
	return func(env *eventsv1.Envelope) {
		if env.GetType() != "runner.task.status_changed" {
			return
		}
		var payload structpb.Struct
		if err := env.GetPayload().UnmarshalTo(&payload); err != nil {
			return
		}
		switch payload.GetFields()["status"].GetStringValue() {
		case "completed", "failed", "stopped":
			fmt.Fprintln(os.Stderr, "crashpoint before-terminal-event reached")
			select {}
		}
	}
}

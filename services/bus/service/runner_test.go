package service_test

import (
	"context"
	"net"
	"testing"

	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/services/bus/service"
)

// TestUnreachableRunner: with the runner's address set and nothing
// listening there, an unrouted message is not lost: the publisher's ack says
// the runner is unreachable and names the setting, and the message is
// dead-lettered with that reason, ready to be redriven.
func TestUnreachableRunner(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the bus")
	}
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	_ = l.Close()
	cfg := defaultConfig(t, map[string]string{"CONCLAVE_BUS_RUNNER_ADDR": closed, "CONCLAVE_BUS_RUNNER_AGENT_TYPE": "bub-agent",
		"CONCLAVE_BUS_WORKSPACE": t.TempDir(), "CONCLAVE_BUS_SPAWN_TIMEOUT": "20s"})
	tel, err := telemetry.New(context.Background(), telemetry.Config{ServiceName: "bus-test"})
	if err != nil {
		t.Fatal(err)
	}
	launcher, conn, err := service.RunnerLauncher(cfg, tel)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	bus := startBus(t, cfg, busOption{launcher: launcher, tel: tel})
	p := bus.client(t, "bridge", "")
	res := p.result(2, "sendMessage", `{"topic":"tg:7","payload":{"type":"telegram_message","text":"hi"}}`)
	ack := testenv.At[map[string]any](t, res, "acks", 0)
	msg, _ := ack["message"].(string)
	for _, want := range []string{"could not start an agent", "the runner at " + closed + " (CONCLAVE_BUS_RUNNER_ADDR) is unreachable", "dead-lettered"} {
		if ack["processed"] != false || !contains(msg, want) {
			t.Errorf("ack %v lacks %q", ack, want)
		}
	}
	var dl deadLetters
	getJSON(t, "GET", bus.http+"/v1/dead-letters", &dl)
	if len(dl.DeadLetters) != 1 || dl.DeadLetters[0].Topic != "tg:7" || !contains(dl.DeadLetters[0].LastError, "unreachable") {
		t.Errorf("dead letters %+v", dl)
	}
}

func TestRunnerSettings(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"not host:port", map[string]string{"CONCLAVE_BUS_RUNNER_ADDR": "runner", "CONCLAVE_BUS_RUNNER_AGENT_TYPE": "a", "CONCLAVE_BUS_WORKSPACE": "/w"}, "CONCLAVE_BUS_RUNNER_ADDR"},
		{"no agent type", map[string]string{"CONCLAVE_BUS_RUNNER_ADDR": "127.0.0.1:1", "CONCLAVE_BUS_WORKSPACE": "/w"}, "CONCLAVE_BUS_RUNNER_AGENT_TYPE"},
		{"no workspace", map[string]string{"CONCLAVE_BUS_RUNNER_ADDR": "127.0.0.1:1", "CONCLAVE_BUS_RUNNER_AGENT_TYPE": "a"}, "CONCLAVE_BUS_WORKSPACE"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := defaultConfig(t, nil)
			cfg.RunnerAddr, cfg.RunnerAgentType, cfg.Workspace = tt.env["CONCLAVE_BUS_RUNNER_ADDR"], tt.env["CONCLAVE_BUS_RUNNER_AGENT_TYPE"], tt.env["CONCLAVE_BUS_WORKSPACE"]
			if err := cfg.Validate(); err == nil || !contains(err.Error(), tt.want) {
				t.Errorf("Validate() = %v, want an error naming %s", err, tt.want)
			}
		})
	}
}

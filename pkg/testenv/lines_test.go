package testenv_test

import (
	"net/http"
	"net/http/httptest"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

func TestLines(t *testing.T) {
	t.Parallel()
	// It prints two lines, then waits for a signal, which ends it cleanly.
	l := testenv.StartLines(t, exec.Command("sh", "-c", `trap 'exit 0' INT; echo one; echo two; while :; do sleep 0.1; done`))
	for _, want := range []string{"one", "two"} {
		if got := l.Next(t, time.Minute, "line "+want); got != want {
			t.Fatalf("line %q, want %q", got, want)
		}
	}
	if err := l.Exit(t, time.Minute, syscall.SIGINT); err != nil {
		t.Fatalf("exit after SIGINT: %v", err)
	}
}

func TestDo(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusTeapot)
		_, _ = w.Write([]byte(r.Method + " " + r.URL.Path))
	}))
	t.Cleanup(srv.Close)
	req, err := http.NewRequest(http.MethodPut, srv.URL+"/x", nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp, body := testenv.Do(t, req); resp.StatusCode != http.StatusTeapot || string(body) != "PUT /x" {
		t.Fatalf("%d %q", resp.StatusCode, body)
	}
}

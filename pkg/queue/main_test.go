package queue_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

// fauxqs is the real SQS-compatible server the SQS backend is tested
// against, started once for the package; nil under -short.
var fauxqs *testenv.Component

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if testing.Short() {
		return m.Run()
	}
	c, err := testenv.Fauxqs(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, "queue tests:", err)
		return 1
	}
	defer c.Stop()
	fauxqs = c
	return m.Run()
}

package queue_test

import (
	"os"
	"testing"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

// fauxqs is the real SQS-compatible server the SQS backend is tested
// against, started once for the package; nil under -short.
var fauxqs *testenv.Component

func TestMain(m *testing.M) {
	os.Exit(testenv.RunWith(m, testenv.Fauxqs, &fauxqs))
}

// Command bootstrap is the Librarian governance API (docs/librarian.md) as an AWS
// Lambda (provided.al2023, arm64) behind an API Gateway HTTP API; REST API
// events are accepted too. It only wires: the cold start is
// internal/lambdafn, the handler service.NewHandler, the same one
// functions/librarian/cmd/local and `conclave dev` serve over HTTP.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/conclave-ai/conclave/functions/librarian/internal/apigw"
	"github.com/conclave-ai/conclave/functions/librarian/internal/lambdafn"
)

func main() {
	handler, stop, err := lambdafn.Init(context.Background(), os.LookupEnv, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "librarian: init:", err)
		if rerr := apigw.ReportInitError(err); rerr != nil {
			fmt.Fprintln(os.Stderr, "librarian: reporting the init error:", rerr)
		}
		os.Exit(1)
	}
	lambda.StartWithOptions(handler, lambda.WithEnableSIGTERM(stop))
}

// Command hello is the floor of the Librarian's init-time benchmark: the
// smallest aws-lambda-go function, with nothing to initialize.
package main

import (
	"context"
	"encoding/json"

	"github.com/aws/aws-lambda-go/lambda"
)

func main() {
	lambda.Start(func(_ context.Context, event json.RawMessage) (json.RawMessage, error) { return event, nil })
}

// Package convention holds the telemetry conventions every Conclave
// process follows that need no exporter: domain metric names, and W3C trace
// context on SQS messages. It imports only the OpenTelemetry API and the SQS
// message types, so a process that must start fast (the Librarian Lambda)
// follows the same conventions without linking package telemetry's
// Prometheus, OTLP/gRPC and gRPC instrumentation. Package telemetry
// re-exports everything here.
package convention

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"slices"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"go.opentelemetry.io/otel/propagation"
)

var metricName = regexp.MustCompile(`^conclave_[a-z]+_[a-z0-9_]+$`)

// MetricName is a domain metric's instrument name, conclave_<service>_<thing>.
// It panics on a name outside the convention: names are constants in the
// code, so a bad one is a programming error found by the first test.
func MetricName(service, thing string) string {
	name := "conclave_" + service + "_" + thing
	if !metricName.MatchString(name) {
		panic(fmt.Sprintf("telemetry: metric name %q is not conclave_<service>_<thing> in lower case", name))
	}
	return name
}

// The message carriers use the W3C trace context propagator alone: their
// format is fixed (traceparent and tracestate only) and baggage would cost
// an extra SQS attribute out of the ten a message may have.
var w3c propagation.TraceContext

// SQSCarrier adapts SQS message attributes to propagation.TextMapCarrier.
// Values are written as DataType "String".
type SQSCarrier map[string]types.MessageAttributeValue

// Get returns the string value of attribute key, or "" if it is absent or
// not a string.
func (c SQSCarrier) Get(key string) string {
	if v := c[key].StringValue; v != nil {
		return *v
	}
	return ""
}

// Set stores value as a String attribute named key.
func (c SQSCarrier) Set(key, value string) {
	c[key] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(value)}
}

// Keys returns the attribute names.
func (c SQSCarrier) Keys() []string { return slices.Collect(maps.Keys(c)) }

// InjectSQS writes the trace context of ctx into attrs, which must not be
// nil, as the attributes "traceparent" and, when ctx has trace state,
// "tracestate". Any previous values of those attributes are removed first, so
// a forwarded message never carries a stale parent.
//
// SQS allows at most 10 attributes per message and InjectSQS adds at most 2,
// so producers must keep their own attributes to 8 or fewer. Consumers must
// ask for these attributes in ReceiveMessage (MessageAttributeNames "All", or
// "traceparent" and "tracestate"), otherwise SQS does not return them.
func InjectSQS(ctx context.Context, attrs map[string]types.MessageAttributeValue) {
	for _, f := range w3c.Fields() {
		delete(attrs, f)
	}
	w3c.Inject(ctx, SQSCarrier(attrs))
}

// ExtractSQS returns ctx with the remote span context carried by a
// message's attributes, for the consumer to start its span under. Missing or
// malformed attributes leave ctx unchanged.
func ExtractSQS(ctx context.Context, attrs map[string]types.MessageAttributeValue) context.Context {
	return w3c.Extract(ctx, SQSCarrier(attrs))
}

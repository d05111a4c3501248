package queue

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/conclave-ai/conclave/pkg/telemetry/convention"
)

// SQS's defaults and ranges that Definition maps onto.
const (
	defaultVisibility = 30 * time.Second
	defaultRetention  = 4 * 24 * time.Hour
	minRetention      = time.Minute
	maxRetention      = 14 * 24 * time.Hour
	maxReceiveCount   = 1000
	maxNameLen        = 80
	// stringType is the DataType of every attribute, counted in its size.
	stringType = "String"
	// callTimeout bounds a call whose ctx has no deadline; a long poll gets
	// its wait on top.
	callTimeout = 30 * time.Second
)

// withDeadline makes sure no call can hang: it keeps the caller's deadline
// and adds one of extra+callTimeout when there is none.
func withDeadline(ctx context.Context, extra time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, extra+callTimeout)
}

// ceilSeconds rounds d up to whole seconds, the granularity of SQS, so that
// both backends treat a given duration the same way. Negative durations are
// left for the range checks to reject.
func ceilSeconds(d time.Duration) time.Duration {
	if d <= 0 {
		return d
	}
	return (d + time.Second - 1) / time.Second * time.Second
}

func checkRange(what string, d, lo, hi time.Duration) error {
	if d < lo || d > hi {
		return fmt.Errorf("%w: %s %v is outside [%v, %v]", ErrInvalid, what, d, lo, hi)
	}
	return nil
}

func validName(name string) error {
	if name == "" || len(name) > maxNameLen {
		return fmt.Errorf("%w: queue name %q must be 1 to %d characters", ErrInvalid, name, maxNameLen)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return fmt.Errorf("%w: queue name %q may only hold letters, digits, '-' and '_'", ErrInvalid, name)
		}
	}
	return nil
}

// normalized validates d and fills in defaults, so both backends store and
// compare the same values.
func (d Definition) normalized() (Definition, error) {
	if err := validName(d.Name); err != nil {
		return d, err
	}
	if d.VisibilityTimeout == 0 {
		d.VisibilityTimeout = defaultVisibility
	}
	if d.Retention == 0 {
		d.Retention = defaultRetention
	}
	d.VisibilityTimeout = ceilSeconds(d.VisibilityTimeout)
	d.Delay = ceilSeconds(d.Delay)
	d.Retention = ceilSeconds(d.Retention)
	for _, err := range []error{
		checkRange("visibility timeout", d.VisibilityTimeout, 0, MaxVisibility),
		checkRange("delay", d.Delay, 0, MaxDelay),
		checkRange("retention", d.Retention, minRetention, maxRetention),
	} {
		if err != nil {
			return d, fmt.Errorf("queue %q: %w", d.Name, err)
		}
	}
	switch {
	case d.MaxReceiveCount < 0 || d.MaxReceiveCount > maxReceiveCount:
		return d, fmt.Errorf("%w: queue %q: max receive count %d is outside [0, %d]", ErrInvalid, d.Name, d.MaxReceiveCount, maxReceiveCount)
	case d.MaxReceiveCount == 0 && d.DeadLetterQueue != "":
		return d, fmt.Errorf("%w: queue %q: dead-letter queue %q needs a max receive count", ErrInvalid, d.Name, d.DeadLetterQueue)
	case d.MaxReceiveCount > 0:
		if d.DeadLetterQueue == "" {
			d.DeadLetterQueue = d.Name + "-dlq"
		}
		if err := validName(d.DeadLetterQueue); err != nil {
			return d, fmt.Errorf("queue %q: dead-letter queue: %w", d.Name, err)
		}
		if d.DeadLetterQueue == d.Name {
			return d, fmt.Errorf("%w: queue %q cannot be its own dead-letter queue", ErrInvalid, d.Name)
		}
	}
	return d, nil
}

// dlqDefinition is the dead-letter queue that Ensure creates for d.
func (d Definition) dlqDefinition() Definition {
	return Definition{Name: d.DeadLetterQueue, VisibilityTimeout: d.VisibilityTimeout, Retention: maxRetention}
}

func (o ReceiveOptions) normalized() (ReceiveOptions, error) {
	if o.Max == 0 {
		o.Max = 1
	}
	if o.Max < 1 || o.Max > MaxBatch {
		return o, fmt.Errorf("%w: receive max %d is outside [1, %d]", ErrInvalid, o.Max, MaxBatch)
	}
	o.Wait, o.Visibility = ceilSeconds(o.Wait), ceilSeconds(o.Visibility)
	if err := checkRange("receive wait", o.Wait, 0, MaxWait); err != nil {
		return o, err
	}
	return o, checkRange("visibility", o.Visibility, 0, MaxVisibility)
}

// prepared is an Outgoing that passed validation, with its trace context.
type prepared struct {
	body  string
	attrs map[string]string
	// delay is the message's own delay; 0 means the queue's.
	delay time.Duration
}

// size is what SQS counts against MaxMessageSize.
func (p prepared) size() int {
	n := len(p.body)
	for k, v := range p.attrs {
		n += len(k) + len(stringType) + len(v)
	}
	return n
}

// prepare validates msgs and adds the trace context of ctx to each, so the
// backends only ever see messages SQS would accept.
func prepare(ctx context.Context, msgs []Outgoing) ([]prepared, error) {
	if len(msgs) == 0 {
		return nil, fmt.Errorf("%w: no messages to send", ErrInvalid)
	}
	trace := traceAttributes(ctx)
	out := make([]prepared, len(msgs))
	for i, m := range msgs {
		attrs := make(map[string]string, len(m.Attributes)+len(trace))
		for k, v := range m.Attributes {
			if err := validAttribute(k, v); err != nil {
				return nil, fmt.Errorf("message %d: %w", i, err)
			}
			attrs[k] = v
		}
		// The producer's context replaces any forwarded trace attributes, so
		// a message never names a stale parent.
		for _, k := range traceFields {
			delete(attrs, k)
		}
		maps.Copy(attrs, trace)
		p := prepared{body: string(m.Body), attrs: attrs, delay: ceilSeconds(m.Delay)}
		if err := validText("message body", p.body); err != nil {
			return nil, fmt.Errorf("message %d: %w", i, err)
		}
		if err := checkRange("delay", p.delay, 0, MaxDelay); err != nil {
			return nil, fmt.Errorf("message %d: %w", i, err)
		}
		if n := len(attrs); n > MaxAttributes {
			return nil, fmt.Errorf("%w: message %d has %d attributes (with trace context), over the limit of %d", ErrTooManyAttributes, i, n, MaxAttributes)
		}
		if n := p.size(); n > MaxMessageSize {
			return nil, fmt.Errorf("%w: message %d is %d bytes (body and attributes), over the limit of %d bytes", ErrMessageTooLarge, i, n, MaxMessageSize)
		}
		out[i] = p
	}
	return out, nil
}

// validText accepts what SQS accepts in bodies and String attribute values:
// non-empty UTF-8 in the XML 1.0 character set. what names s in errors.
func validText(what, s string) error {
	if s == "" {
		return fmt.Errorf("%w: empty %s", ErrInvalid, what)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalid, what)
	}
	for i, r := range s {
		if !validChar(r) {
			return fmt.Errorf("%w: %s has a character SQS does not accept at byte %d", ErrInvalid, what, i)
		}
	}
	return nil
}

func validChar(r rune) bool {
	return r == 0x9 || r == 0xA || r == 0xD ||
		r >= 0x20 && r <= 0xD7FF || r >= 0xE000 && r <= 0xFFFD || r >= 0x10000 && r <= 0x10FFFF
}

// validAttribute applies SQS's rules for attribute names and String values.
func validAttribute(name, value string) error {
	bad := name == "" || len(name) > 256 || name[0] == '.' || name[len(name)-1] == '.' ||
		strings.Contains(name, "..") ||
		strings.HasPrefix(strings.ToLower(name), "aws.") || strings.HasPrefix(strings.ToLower(name), "amazon.")
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			bad = true
		}
	}
	if bad {
		return fmt.Errorf("%w: attribute name %q (want 1 to 256 of letters, digits, '-', '_', '.', not starting with AWS. or Amazon.)", ErrInvalid, name)
	}
	return validText(fmt.Sprintf("value of attribute %q", name), value)
}

// traceFields are the attributes the W3C propagator writes.
var traceFields = []string{"traceparent", "tracestate"}

// traceAttributes renders the trace context of ctx through pkg/telemetry's
// SQS carrier, so every hop of Conclave writes it the same way.
func traceAttributes(ctx context.Context) map[string]string {
	carrier := map[string]types.MessageAttributeValue{}
	convention.InjectSQS(ctx, carrier)
	out := make(map[string]string, len(carrier))
	for k, v := range carrier {
		if v.StringValue != nil {
			out[k] = *v.StringValue
		}
	}
	return out
}

// TraceContext returns ctx with the producer's span context as the remote
// parent, so a span started from it joins the producer's trace. Consume does
// this for its handlers.
func (m Message) TraceContext(ctx context.Context) context.Context {
	carrier := make(map[string]types.MessageAttributeValue, len(traceFields))
	for _, k := range traceFields {
		if v, ok := m.Attributes[k]; ok {
			convention.SQSCarrier(carrier).Set(k, v)
		}
	}
	return convention.ExtractSQS(ctx, carrier)
}

package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"
)

// SQS is the Queue backend for Amazon SQS and servers that speak its
// protocol (fauxqs in tests).
type SQS struct {
	client   *sqs.Client
	endpoint string
	// urls caches queue name → URL: every operation needs the URL and a
	// GetQueueUrl per call would double the request count.
	urls sync.Map
}

var _ Queue = (*SQS)(nil)

// NewSQS returns an SQS backend using cfg, which the caller loads (for
// example with config.LoadDefaultConfig) so that this package never reads
// the environment. endpoint, when not "", overrides the service endpoint,
// e.g. http://127.0.0.1:4566 for fauxqs. Transient errors are retried by
// cfg's retryer, the SDK's standard retryer with backoff when cfg has none.
func NewSQS(cfg aws.Config, endpoint string) *SQS {
	client := sqs.NewFromConfig(cfg, func(o *sqs.Options) {
		if endpoint != "" {
			o.BaseEndpoint = aws.String(endpoint)
		}
	})
	if endpoint == "" {
		endpoint = "https://sqs." + cfg.Region + ".amazonaws.com"
	}
	return &SQS{client: client, endpoint: endpoint}
}

// Ensure implements Queue. It creates the dead-letter queue first because
// the source's redrive policy names it by ARN.
func (s *SQS) Ensure(ctx context.Context, def Definition) error {
	def, err := def.normalized()
	if err != nil {
		return fmt.Errorf("queue: ensure: %w", err)
	}
	ctx, cancel := withDeadline(ctx, 0)
	defer cancel()
	redrive := "" // an empty policy removes an earlier one
	if def.MaxReceiveCount > 0 {
		dlqURL, err := s.ensure(ctx, def.dlqDefinition(), "")
		if err != nil {
			return err
		}
		out, err := s.client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
			QueueUrl:       aws.String(dlqURL),
			AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn},
		})
		if err != nil {
			return s.fail("get the ARN of dead-letter queue", def.DeadLetterQueue, err)
		}
		policy, err := json.Marshal(struct {
			DeadLetterTargetArn string `json:"deadLetterTargetArn"`
			MaxReceiveCount     int    `json:"maxReceiveCount"`
		}{out.Attributes[string(types.QueueAttributeNameQueueArn)], def.MaxReceiveCount})
		if err != nil {
			return fmt.Errorf("queue: ensure %q: redrive policy: %w", def.Name, err)
		}
		redrive = string(policy)
	}
	_, err = s.ensure(ctx, def, redrive)
	return err
}

// ensure creates or updates one queue and returns its URL. CreateQueue
// refuses a name that exists with other attributes, and leaves attributes
// it was not given (such as an old redrive policy) alone, so the
// attributes are always set afterwards too.
func (s *SQS) ensure(ctx context.Context, def Definition, redrive string) (string, error) {
	attrs := map[string]string{
		string(types.QueueAttributeNameVisibilityTimeout):      secs(def.VisibilityTimeout),
		string(types.QueueAttributeNameDelaySeconds):           secs(def.Delay),
		string(types.QueueAttributeNameMessageRetentionPeriod): secs(def.Retention),
	}
	var url string
	out, err := s.client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(def.Name), Attributes: attrs})
	switch {
	case err == nil:
		url = aws.ToString(out.QueueUrl)
	case isAPIError(err, "QueueNameExists", "QueueAlreadyExists"):
		if url, err = s.url(ctx, def.Name); err != nil {
			return "", err
		}
	default:
		return "", s.fail("create", def.Name, err)
	}
	attrs[string(types.QueueAttributeNameRedrivePolicy)] = redrive
	if _, err := s.client.SetQueueAttributes(ctx, &sqs.SetQueueAttributesInput{QueueUrl: aws.String(url), Attributes: attrs}); err != nil {
		return "", s.fail("set attributes of", def.Name, err)
	}
	s.urls.Store(def.Name, url)
	return url, nil
}

func secs(d time.Duration) string { return strconv.Itoa(int(d / time.Second)) }

// Send implements Queue. Messages go in SendMessageBatch requests of at most
// MaxBatch entries and MaxMessageSize bytes in total (the batch limit of
// SQS), one request after the other so that IDs come back in order.
func (s *SQS) Send(ctx context.Context, queue string, msgs ...Outgoing) ([]string, error) {
	ps, err := prepare(ctx, msgs)
	if err != nil {
		return nil, fmt.Errorf("queue: send to %q: %w", queue, err)
	}
	ctx, cancel := withDeadline(ctx, 0)
	defer cancel()
	url, err := s.url(ctx, queue)
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(ps))
	var failed []FailedEntry
	for start := 0; start < len(ps); {
		end, size := start, 0
		for end < len(ps) && end-start < MaxBatch && size+ps[end].size() <= MaxMessageSize {
			size += ps[end].size()
			end++
		}
		entries := make([]types.SendMessageBatchRequestEntry, 0, end-start)
		for i := start; i < end; i++ {
			entries = append(entries, sendEntry(i, ps[i]))
		}
		out, err := s.client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(url), Entries: entries})
		if err != nil {
			err = s.fail("send to", queue, err)
			for i := start; i < len(ps); i++ {
				failed = append(failed, FailedEntry{Index: i, Code: "NotSent", Message: "the request failed"})
			}
			return ids, &SendError{Queue: queue, Failed: failed, Err: err}
		}
		for _, r := range out.Successful {
			if i, ok := entryIndex(r.Id, start, end); ok {
				ids[i] = aws.ToString(r.MessageId)
			}
		}
		for _, f := range out.Failed {
			if i, ok := entryIndex(f.Id, start, end); ok {
				failed = append(failed, FailedEntry{Index: i, Code: aws.ToString(f.Code), Message: aws.ToString(f.Message)})
			}
		}
		start = end
	}
	// An entry in neither list would be lost silently; report it too.
	for i, id := range ids {
		if id == "" && !slices.ContainsFunc(failed, func(f FailedEntry) bool { return f.Index == i }) {
			failed = append(failed, FailedEntry{Index: i, Code: "NoResult", Message: "the batch response did not mention the entry"})
		}
	}
	if len(failed) > 0 {
		slices.SortFunc(failed, func(a, b FailedEntry) int { return a.Index - b.Index })
		return ids, &SendError{Queue: queue, Failed: failed}
	}
	return ids, nil
}

func sendEntry(i int, p prepared) types.SendMessageBatchRequestEntry {
	e := types.SendMessageBatchRequestEntry{
		Id:          aws.String(strconv.Itoa(i)),
		MessageBody: aws.String(p.body),
	}
	if p.delay > 0 {
		e.DelaySeconds = int32(p.delay / time.Second)
	}
	if len(p.attrs) > 0 {
		e.MessageAttributes = make(map[string]types.MessageAttributeValue, len(p.attrs))
		for k, v := range p.attrs {
			e.MessageAttributes[k] = types.MessageAttributeValue{DataType: aws.String(stringType), StringValue: aws.String(v)}
		}
	}
	return e
}

// entryIndex maps a batch entry ID back to the message's index, ignoring
// IDs the request did not contain.
func entryIndex(id *string, start, end int) (int, bool) {
	i, err := strconv.Atoi(aws.ToString(id))
	return i, err == nil && i >= start && i < end
}

// Receive implements Queue.
func (s *SQS) Receive(ctx context.Context, queue string, opts ReceiveOptions) ([]Message, error) {
	opts, err := opts.normalized()
	if err != nil {
		return nil, fmt.Errorf("queue: receive from %q: %w", queue, err)
	}
	ctx, cancel := withDeadline(ctx, opts.Wait)
	defer cancel()
	url, err := s.url(ctx, queue)
	if err != nil {
		return nil, err
	}
	msgs, err := s.receive(ctx, url, opts)
	if err != nil {
		return nil, s.fail("receive from", queue, err)
	}
	return msgs, nil
}

func (s *SQS) receive(ctx context.Context, url string, opts ReceiveOptions) ([]Message, error) {
	in := &sqs.ReceiveMessageInput{
		QueueUrl:              aws.String(url),
		MaxNumberOfMessages:   int32(opts.Max),
		WaitTimeSeconds:       int32(opts.Wait / time.Second),
		MessageAttributeNames: []string{"All"},
		MessageSystemAttributeNames: []types.MessageSystemAttributeName{
			types.MessageSystemAttributeNameApproximateReceiveCount,
			types.MessageSystemAttributeNameSentTimestamp,
		},
	}
	if opts.Visibility > 0 {
		in.VisibilityTimeout = int32(opts.Visibility / time.Second)
	}
	out, err := s.client.ReceiveMessage(ctx, in)
	if err != nil {
		return nil, err
	}
	msgs := make([]Message, 0, len(out.Messages))
	for _, m := range out.Messages {
		msg := Message{
			ID:            aws.ToString(m.MessageId),
			Body:          []byte(aws.ToString(m.Body)),
			ReceiptHandle: aws.ToString(m.ReceiptHandle),
		}
		msg.ReceiveCount, _ = strconv.Atoi(m.Attributes[string(types.MessageSystemAttributeNameApproximateReceiveCount)])
		if ms, err := strconv.ParseInt(m.Attributes[string(types.MessageSystemAttributeNameSentTimestamp)], 10, 64); err == nil {
			msg.SentAt = time.UnixMilli(ms)
		}
		// Only String attributes exist in Conclave; others (from foreign
		// producers) have no string form to offer.
		for k, v := range m.MessageAttributes {
			if v.StringValue != nil {
				if msg.Attributes == nil {
					msg.Attributes = make(map[string]string, len(m.MessageAttributes))
				}
				msg.Attributes[k] = *v.StringValue
			}
		}
		msgs = append(msgs, msg)
	}
	return msgs, nil
}

// Delete implements Queue.
func (s *SQS) Delete(ctx context.Context, queue, receiptHandle string) error {
	ctx, cancel := withDeadline(ctx, 0)
	defer cancel()
	url, err := s.url(ctx, queue)
	if err != nil {
		return err
	}
	_, err = s.client.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(url), ReceiptHandle: aws.String(receiptHandle)})
	if err != nil {
		return s.fail("delete from", queue, receiptError(err))
	}
	return nil
}

// ChangeVisibility implements Queue.
func (s *SQS) ChangeVisibility(ctx context.Context, queue, receiptHandle string, d time.Duration) error {
	d = ceilSeconds(d)
	if err := checkRange("visibility", d, 0, MaxVisibility); err != nil {
		return fmt.Errorf("queue: change visibility in %q: %w", queue, err)
	}
	ctx, cancel := withDeadline(ctx, 0)
	defer cancel()
	url, err := s.url(ctx, queue)
	if err != nil {
		return err
	}
	_, err = s.client.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{
		QueueUrl:          aws.String(url),
		ReceiptHandle:     aws.String(receiptHandle),
		VisibilityTimeout: int32(d / time.Second),
	})
	if err != nil {
		return s.fail("change visibility in", queue, receiptError(err))
	}
	return nil
}

// Redrive implements Queue as receive, send and delete, not
// StartMessageMoveTask: fauxqs lacks the move-task API, and a move task is
// asynchronous, so the count of moved messages would need polling anyway.
// It is at-least-once: a crash between send and delete leaves a copy in
// both queues. It stops at the first empty receive, which waits a second so
// that SQS's sampling of its servers cannot end it early.
func (s *SQS) Redrive(ctx context.Context, dlq, source string) (int, error) {
	if dlq == source {
		return 0, fmt.Errorf("queue: redrive %q: %w: source and dead-letter queue are the same", dlq, ErrInvalid)
	}
	dlqURL, err := s.urlWithin(ctx, dlq)
	if err != nil {
		return 0, err
	}
	srcURL, err := s.urlWithin(ctx, source)
	if err != nil {
		return 0, err
	}
	moved := 0
	for {
		n, err := s.redriveBatch(ctx, dlq, dlqURL, source, srcURL)
		moved += n
		if err != nil || n == 0 {
			return moved, err
		}
	}
}

// redriveVisibility hides the messages being moved long enough for one
// send and one delete.
const redriveVisibility = 30 * time.Second

func (s *SQS) redriveBatch(ctx context.Context, dlq, dlqURL, source, srcURL string) (int, error) {
	ctx, cancel := withDeadline(ctx, time.Second)
	defer cancel()
	msgs, err := s.receive(ctx, dlqURL, ReceiveOptions{Max: MaxBatch, Wait: time.Second, Visibility: redriveVisibility})
	if err != nil || len(msgs) == 0 {
		if err != nil {
			err = s.fail("redrive: receive from", dlq, err)
		}
		return 0, err
	}
	entries := make([]types.SendMessageBatchRequestEntry, len(msgs))
	for i, m := range msgs {
		// The attributes go over unchanged: the trace context is the
		// original producer's, not the operator's who redrives.
		entries[i] = sendEntry(i, prepared{body: string(m.Body), attrs: m.Attributes})
	}
	out, err := s.client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(srcURL), Entries: entries})
	if err != nil {
		return 0, s.fail("redrive: send to", source, err)
	}
	del := make([]types.DeleteMessageBatchRequestEntry, 0, len(out.Successful))
	for _, r := range out.Successful {
		if i, ok := entryIndex(r.Id, 0, len(msgs)); ok {
			del = append(del, types.DeleteMessageBatchRequestEntry{Id: r.Id, ReceiptHandle: aws.String(msgs[i].ReceiptHandle)})
		}
	}
	if len(del) > 0 {
		dout, err := s.client.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(dlqURL), Entries: del})
		if err != nil {
			return len(del), fmt.Errorf("queue: redrive: delete moved messages from %q at %s (they will be moved again): %w", dlq, s.endpoint, err)
		}
		if len(dout.Failed) > 0 {
			return len(del), fmt.Errorf("queue: redrive: %d moved message(s) not deleted from %q at %s, they will be moved again", len(dout.Failed), dlq, s.endpoint)
		}
	}
	if len(out.Failed) > 0 {
		f := out.Failed[0]
		return len(del), fmt.Errorf("queue: redrive to %q at %s: %d message(s) refused, first %s: %s; they stay in %q",
			source, s.endpoint, len(out.Failed), aws.ToString(f.Code), aws.ToString(f.Message), dlq)
	}
	return len(del), nil
}

// urlWithin is url with its own deadline, for calls that make many requests.
func (s *SQS) urlWithin(ctx context.Context, queue string) (string, error) {
	ctx, cancel := withDeadline(ctx, 0)
	defer cancel()
	return s.url(ctx, queue)
}

// url returns the queue's URL, from the cache when possible.
func (s *SQS) url(ctx context.Context, queue string) (string, error) {
	if u, ok := s.urls.Load(queue); ok {
		return u.(string), nil
	}
	if err := validName(queue); err != nil {
		return "", fmt.Errorf("queue: %w", err)
	}
	out, err := s.client.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(queue)})
	if err != nil {
		return "", s.fail("look up", queue, err)
	}
	u := aws.ToString(out.QueueUrl)
	s.urls.Store(queue, u)
	return u, nil
}

// fail wraps err from operation op on queue, naming the endpoint. SQS's "no
// such queue" becomes ErrQueueNotFound, and the cached URL is forgotten
// since the queue may have been deleted.
func (s *SQS) fail(op, queue string, err error) error {
	var nf *types.QueueDoesNotExist
	if errors.As(err, &nf) || isAPIError(err, "QueueDoesNotExist", "NonExistentQueue") {
		s.urls.Delete(queue)
		return fmt.Errorf("queue: %s %q at %s: %w: %w", op, queue, s.endpoint, ErrQueueNotFound, err)
	}
	return fmt.Errorf("queue: %s %q at %s: %w", op, queue, s.endpoint, err)
}

// receiptError marks SQS's receipt handle errors as ErrInvalidReceipt.
// InvalidParameterValue is among them because real SQS answers so for an
// expired handle, and the handle is the only parameter not checked before
// the request.
func receiptError(err error) error {
	if isAPIError(err, "ReceiptHandleIsInvalid", "MessageNotInflight", "InvalidParameterValue") {
		return fmt.Errorf("%w: %w", ErrInvalidReceipt, err)
	}
	return err
}

// isAPIError tells whether err is an SQS error with one of codes. SQS's JSON
// protocol reports the legacy query code when it has one, with or without
// the "AWS.SimpleQueueService." prefix, so both spellings are accepted.
func isAPIError(err error, codes ...string) bool {
	var api smithy.APIError
	if !errors.As(err, &api) {
		return false
	}
	code := strings.TrimPrefix(api.ErrorCode(), "AWS.SimpleQueueService.")
	return slices.Contains(codes, code)
}

package queue_test

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/testenv"
)

// rawSQS is a plain SDK client on fauxqs, to look at what the backend
// configured and to set up what the port cannot express.
func rawSQS(t *testing.T) *sqs.Client {
	t.Helper()
	if fauxqs == nil {
		t.Skip("-short: fauxqs (a real component) is not started")
	}
	return sqs.NewFromConfig(testenv.AWSConfig(), func(o *sqs.Options) { o.BaseEndpoint = aws.String(fauxqs.Endpoint) })
}

func attributes(t *testing.T, raw *sqs.Client, name string) map[string]string {
	t.Helper()
	u, err := raw.GetQueueUrl(ctx(t), &sqs.GetQueueUrlInput{QueueName: aws.String(name)})
	if err != nil {
		t.Fatal(err)
	}
	out, err := raw.GetQueueAttributes(ctx(t), &sqs.GetQueueAttributesInput{
		QueueUrl: u.QueueUrl, AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameAll},
	})
	if err != nil {
		t.Fatal(err)
	}
	return out.Attributes
}

// TestSQSEnsureConfiguresQueues checks the attributes Ensure writes, since
// infra/ must declare the same ones, and that changing a definition
// updates an existing queue.
func TestSQSEnsureConfiguresQueues(t *testing.T) {
	t.Parallel()
	raw := rawSQS(t)
	q := queue.NewSQS(testenv.AWSConfig(), fauxqs.Endpoint)
	def := newQueue(t, q, queue.Definition{VisibilityTimeout: 1500 * time.Millisecond, MaxReceiveCount: 4, Delay: 2 * time.Second, Retention: time.Hour})

	a := attributes(t, raw, def.Name)
	for k, want := range map[string]string{"VisibilityTimeout": "2", "DelaySeconds": "2", "MessageRetentionPeriod": "3600"} {
		if a[k] != want {
			t.Errorf("%s = %q, want %q", k, a[k], want)
		}
	}
	var policy struct {
		DeadLetterTargetArn string `json:"deadLetterTargetArn"`
		MaxReceiveCount     int    `json:"maxReceiveCount"`
	}
	if err := json.Unmarshal([]byte(a["RedrivePolicy"]), &policy); err != nil {
		t.Fatalf("RedrivePolicy %q: %v", a["RedrivePolicy"], err)
	}
	dlq := attributes(t, raw, def.DeadLetterQueue)
	if policy.DeadLetterTargetArn != dlq["QueueArn"] || policy.MaxReceiveCount != 4 {
		t.Errorf("redrive policy %+v, want %s after 4 receives", policy, dlq["QueueArn"])
	}
	if dlq["MessageRetentionPeriod"] != strconv.Itoa(14*24*3600) {
		t.Errorf("dead-letter retention %s, want 14 days", dlq["MessageRetentionPeriod"])
	}

	// Without a receive limit the policy goes, and other changes land.
	if err := q.Ensure(ctx(t), queue.Definition{Name: def.Name, VisibilityTimeout: 7 * time.Second}); err != nil {
		t.Fatal(err)
	}
	a = attributes(t, raw, def.Name)
	if a["RedrivePolicy"] != "" || a["VisibilityTimeout"] != "7" || a["DelaySeconds"] != "0" {
		t.Errorf("after redefinition: RedrivePolicy %q, VisibilityTimeout %s, DelaySeconds %s; want none, 7, 0",
			a["RedrivePolicy"], a["VisibilityTimeout"], a["DelaySeconds"])
	}
}

// TestSQSPartialBatchFailureNamesEntries makes SQS refuse some entries of
// a batch while accepting the request: a queue whose MaximumMessageSize
// (set outside the port) is below some messages' size. Send must name
// exactly those and send the rest.
func TestSQSPartialBatchFailureNamesEntries(t *testing.T) {
	t.Parallel()
	raw := rawSQS(t)
	q := queue.NewSQS(testenv.AWSConfig(), fauxqs.Endpoint)
	def := newQueue(t, q, queue.Definition{})
	u, err := raw.GetQueueUrl(ctx(t), &sqs.GetQueueUrlInput{QueueName: aws.String(def.Name)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.SetQueueAttributes(ctx(t), &sqs.SetQueueAttributesInput{
		QueueUrl: u.QueueUrl, Attributes: map[string]string{"MaximumMessageSize": "1024"},
	}); err != nil {
		t.Fatal(err)
	}
	msgs := make([]queue.Outgoing, 12)
	for i := range msgs {
		msgs[i] = body("m" + strconv.Itoa(i))
	}
	big := strings.Repeat("x", 2000)
	msgs[3], msgs[11] = body(big), body(big)
	ids, err := q.Send(ctx(t), def.Name, msgs...)
	var se *queue.SendError
	if !errors.As(err, &se) {
		t.Fatalf("Send: %v, want a *SendError", err)
	}
	if len(se.Failed) != 2 || se.Failed[0].Index != 3 || se.Failed[1].Index != 11 || se.Failed[0].Code == "" {
		t.Fatalf("failed entries %+v, want #3 and #11 with a code", se.Failed)
	}
	for _, s := range []string{"#3", "#11", def.Name} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %s", err, s)
		}
	}
	got := map[string]bool{}
	for len(got) < 10 {
		m := receiveOne(t, q, def.Name, queue.ReceiveOptions{})
		got[string(m.Body)] = true
		if err := q.Delete(ctx(t), def.Name, m.ReceiptHandle); err != nil {
			t.Fatal(err)
		}
	}
	for i, id := range ids {
		if sent := i != 3 && i != 11; sent != (id != "") || sent != got["m"+strconv.Itoa(i)] {
			t.Errorf("message %d: id %q, received %v; want both only when it was sent", i, id, got["m"+strconv.Itoa(i)])
		}
	}
}

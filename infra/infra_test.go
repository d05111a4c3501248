// Package infra checks template.yaml, Conclave's AWS side, against the code:
// every table and queue a deployable defines in Go is declared with the keys,
// TTL attribute and attributes (redrive policy included) the code itself
// creates it with, nothing else is declared, every IAM role reaches only its
// own deployable's tables and queues with only calls the AWS clients make,
// and the Librarian's HTTP API routes exactly the patterns its handler
// serves. The template is parsed with goformation, the library AWS keeps for
// CloudFormation and SAM in Go, so no AWS account is needed.
package infra

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/awslabs/goformation/v7"
	"github.com/awslabs/goformation/v7/cloudformation"
	cfndynamodb "github.com/awslabs/goformation/v7/cloudformation/dynamodb"
	cfnsqs "github.com/awslabs/goformation/v7/cloudformation/sqs"
	"github.com/awslabs/goformation/v7/intrinsics"

	librarian "github.com/conclave-ai/conclave/functions/librarian/service"
	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/store"
	bus "github.com/conclave-ai/conclave/services/bus/service"
	gateway "github.com/conclave-ai/conclave/services/gateway/service"
	runner "github.com/conclave-ai/conclave/services/runner/service"
)

// deployable is one process that gets its own IAM role.
type deployable struct {
	name   string
	role   string // the role's logical ID in the template
	tables []store.Table
	queues []queue.Definition
}

// deployables lists what the template must serve. A new service is one
// more line here, with its service package's Tables and Queues (and, for
// `go mod tidy`, a replace line for its module in go.mod, as for the
// others).
var deployables = []deployable{
	{name: "gateway", role: "GatewayRole", tables: gateway.Tables},
	{name: "bus", role: "BusRole", tables: bus.Tables, queues: bus.Queues(bus.Config{})},
	{name: "librarian", role: "LibrarianRole", tables: librarian.Tables, queues: librarian.Queues(librarian.Config{})},
	{name: "runner", role: "RunnerRole", tables: runner.Tables, queues: runner.Queues(runnerDefaults())},
}

// runnerDefaults is the runner's configuration with its defaults, as an
// unconfigured deployment runs it: its queue names and visibility.
func runnerDefaults() runner.Config {
	var cfg struct{ Runner runner.Config }
	env := map[string]string{"CONCLAVE_RUNNER_CLIENT_TOKENS": "a-token-of-sixteen-or-more", "CONCLAVE_RUNNER_WORKSPACE_ROOTS": "/workspaces"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	if err := config.Load(context.Background(), &cfg, "runner", nil, lookup, io.Discard); err != nil {
		panic(fmt.Sprintf("the runner's default configuration: %v", err))
	}
	return cfg.Runner
}

// repoRoot is where the Go sources the test reads live.
const repoRoot = ".."

// parsed is the template as goformation reads it, with references kept
// legible (see openTemplate), and its Prefix parameter's default.
type parsed struct {
	*cloudformation.Template
	prefix string
	// raw holds each resource's properties unprocessed, for the ones
	// goformation's types miss.
	raw map[string]map[string]any
}

var (
	templateOnce sync.Once
	template     parsed
	templateErr  error
)

func openTemplate(t *testing.T) parsed {
	t.Helper()
	templateOnce.Do(func() {
		data, err := os.ReadFile("template.yaml")
		if err != nil {
			templateErr = err
			return
		}
		var raw struct {
			Parameters map[string]struct{ Default any }
			Resources  map[string]struct{ Properties map[string]any }
		}
		if err := yamlParameters(data, &raw); err != nil {
			templateErr = err
			return
		}
		tmpl, err := goformation.ParseYAMLWithOptions(data, &intrinsics.ProcessorOptions{IntrinsicHandlerOverrides: referenceHandlers()})
		if err != nil {
			templateErr = fmt.Errorf("template.yaml: %w", err)
			return
		}
		prefix, _ := raw.Parameters["Prefix"].Default.(string)
		template = parsed{Template: tmpl, prefix: prefix, raw: map[string]map[string]any{}}
		for id, r := range raw.Resources {
			template.raw[id] = r.Properties
		}
	})
	if templateErr != nil {
		t.Fatal(templateErr)
	}
	return template
}

// yamlParameters reads the template with intrinsic functions left alone:
// the parameters' defaults, which references resolve to, and the raw
// properties.
func yamlParameters(data []byte, out any) error {
	processed, err := intrinsics.ProcessYAML(data, &intrinsics.ProcessorOptions{NoProcess: true})
	if err != nil {
		return fmt.Errorf("template.yaml: %w", err)
	}
	return json.Unmarshal(processed, out)
}

// References are resolved to markers the test can follow: "{{ref X}}" and
// "{{X.Attr}}" for resources, the default for parameters, fixed values for
// pseudo parameters. goformation's own handlers drop resource references
// (GetAtt resolves to nil), which would hide what an IAM policy reaches.
var subVariable = regexp.MustCompile(`\$\{([A-Za-z0-9:.]+)\}`)

func referenceHandlers() map[string]intrinsics.IntrinsicHandler {
	ref := func(name string, tmpl any) any {
		switch name {
		case "AWS::Partition":
			return "aws"
		case "AWS::Region":
			return "us-east-1"
		case "AWS::AccountId":
			return "123456789012"
		case "AWS::URLSuffix":
			return "amazonaws.com"
		case "AWS::StackName":
			return "conclave"
		}
		if v := intrinsics.Ref("Ref", name, tmpl); v != nil {
			return v // a parameter's default, of its own type
		}
		return "{{ref " + name + "}}"
	}
	return map[string]intrinsics.IntrinsicHandler{
		"Ref": func(_ string, input any, tmpl any) any {
			name, _ := input.(string)
			return ref(name, tmpl)
		},
		"Fn::GetAtt": func(_ string, input any, _ any) any { return getAttMarker(input) },
		"Fn::Sub": func(_ string, input any, tmpl any) any {
			s, ok := input.(string)
			if !ok {
				return nil // the list form is not used in template.yaml
			}
			return subVariable.ReplaceAllStringFunc(s, func(m string) string {
				name := m[2 : len(m)-1]
				if strings.Contains(name, ".") {
					return getAttMarker(name)
				}
				return fmt.Sprint(ref(name, tmpl))
			})
		},
	}
}

// getAttMarker is the marker of Fn::GetAtt's input, "X.Attr" or [X, Attr].
func getAttMarker(input any) string {
	switch v := input.(type) {
	case string:
		return "{{" + v + "}}"
	case []any:
		parts := make([]string, len(v))
		for i, p := range v {
			parts[i] = fmt.Sprint(p)
		}
		return "{{" + strings.Join(parts, ".") + "}}"
	}
	return fmt.Sprintf("{{GetAtt %v}}", input)
}

func TestTablesMatchCode(t *testing.T) {
	tmpl := openTemplate(t)
	declared := map[string]*cfndynamodb.Table{} // by table name
	for id, table := range tmpl.GetAllDynamoDBTableResources() {
		name := aws.ToString(table.TableName)
		if _, dup := declared[name]; dup {
			t.Errorf("table %s is declared twice (%s)", name, id)
		}
		declared[name] = table
	}
	want := map[string]bool{}
	for _, d := range deployables {
		for _, table := range d.tables {
			created := createdTable(t, tmpl.prefix, table)
			name := aws.ToString(created.create.TableName)
			want[name] = true
			t.Run(name, func(t *testing.T) {
				got, ok := declared[name]
				if !ok {
					t.Fatalf("%s defines table %q; template.yaml does not declare %s", d.name, table.Name, name)
				}
				checkTable(t, got, created)
			})
		}
	}
	for name := range declared {
		if !want[name] {
			t.Errorf("template.yaml declares table %s, which no deployable defines", name)
		}
	}
}

func checkTable(t *testing.T, got *cfndynamodb.Table, want tableCreation) {
	t.Helper()
	if g, w := aws.ToString(got.BillingMode), string(want.create.BillingMode); g != w {
		t.Errorf("billing mode %q, the code creates %q", g, w)
	}
	var gotKeys, wantKeys []string
	for _, k := range got.KeySchema {
		gotKeys = append(gotKeys, k.AttributeName+" "+k.KeyType)
	}
	for _, k := range want.create.KeySchema {
		wantKeys = append(wantKeys, aws.ToString(k.AttributeName)+" "+string(k.KeyType))
	}
	if !slices.Equal(gotKeys, wantKeys) {
		t.Errorf("key schema %v, the code creates %v", gotKeys, wantKeys)
	}
	var gotAttrs, wantAttrs []string
	for _, a := range got.AttributeDefinitions {
		gotAttrs = append(gotAttrs, a.AttributeName+" "+a.AttributeType)
	}
	for _, a := range want.create.AttributeDefinitions {
		wantAttrs = append(wantAttrs, aws.ToString(a.AttributeName)+" "+string(a.AttributeType))
	}
	slices.Sort(gotAttrs)
	slices.Sort(wantAttrs)
	if !slices.Equal(gotAttrs, wantAttrs) {
		t.Errorf("attribute definitions %v, the code creates %v", gotAttrs, wantAttrs)
	}
	if len(got.GlobalSecondaryIndexes)+len(got.LocalSecondaryIndexes) != len(want.create.GlobalSecondaryIndexes)+len(want.create.LocalSecondaryIndexes) {
		t.Errorf("declares %d global and %d local indexes; the code creates %d and %d",
			len(got.GlobalSecondaryIndexes), len(got.LocalSecondaryIndexes), len(want.create.GlobalSecondaryIndexes), len(want.create.LocalSecondaryIndexes))
	}
	ttl := got.TimeToLiveSpecification
	switch {
	case want.ttl == nil && ttl != nil:
		t.Errorf("declares TTL on %q; the code enables none", aws.ToString(ttl.AttributeName))
	case want.ttl != nil && (ttl == nil || !ttl.Enabled):
		t.Errorf("TTL is not enabled; the code enables it on %q", aws.ToString(want.ttl.AttributeName))
	case want.ttl != nil && aws.ToString(ttl.AttributeName) != aws.ToString(want.ttl.AttributeName):
		t.Errorf("TTL attribute %q, the code's is %q", aws.ToString(ttl.AttributeName), aws.ToString(want.ttl.AttributeName))
	}
}

// tableCreation is what pkg/store's DynamoDB backend asks DynamoDB for when
// it creates a table.
type tableCreation struct {
	create *dynamodb.CreateTableInput
	ttl    *ddbtypes.TimeToLiveSpecification
}

// createdTable runs the store's own EnsureTable against a recorder, so the
// expectation is the code's, not a copy of it.
func createdTable(t *testing.T, prefix string, table store.Table) tableCreation {
	t.Helper()
	rec := &tableRecorder{}
	if err := store.NewDynamo(rec, store.DynamoOptions{TablePrefix: prefix}).EnsureTable(context.Background(), table); err != nil {
		t.Fatalf("EnsureTable(%q): %v", table.Name, err)
	}
	if rec.created.create == nil {
		t.Fatalf("EnsureTable(%q) did not call CreateTable", table.Name)
	}
	return rec.created
}

// tableRecorder answers the calls EnsureTable makes, as DynamoDB would for
// a new table, and keeps what was asked. Item operations fail: EnsureTable
// makes none.
type tableRecorder struct {
	store.DynamoAPI
	created tableCreation
}

func (r *tableRecorder) CreateTable(_ context.Context, in *dynamodb.CreateTableInput, _ ...func(*dynamodb.Options)) (*dynamodb.CreateTableOutput, error) {
	r.created.create = in
	return &dynamodb.CreateTableOutput{}, nil
}

func (r *tableRecorder) DescribeTable(_ context.Context, in *dynamodb.DescribeTableInput, _ ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error) {
	return &dynamodb.DescribeTableOutput{Table: &ddbtypes.TableDescription{TableName: in.TableName, TableStatus: ddbtypes.TableStatusActive}}, nil
}

func (r *tableRecorder) UpdateTimeToLive(_ context.Context, in *dynamodb.UpdateTimeToLiveInput, _ ...func(*dynamodb.Options)) (*dynamodb.UpdateTimeToLiveOutput, error) {
	r.created.ttl = in.TimeToLiveSpecification
	return &dynamodb.UpdateTimeToLiveOutput{TimeToLiveSpecification: in.TimeToLiveSpecification}, nil
}

func TestQueuesMatchCode(t *testing.T) {
	tmpl := openTemplate(t)
	declared := map[string]*cfnsqs.Queue{} // by queue name
	logicalQueue := map[string]string{}    // logical ID → queue name
	for id, q := range tmpl.GetAllSQSQueueResources() {
		name := aws.ToString(q.QueueName)
		if _, dup := declared[name]; dup {
			t.Errorf("queue %s is declared twice (%s)", name, id)
		}
		declared[name] = q
		logicalQueue[id] = name
	}
	want := map[string]bool{}
	for _, d := range deployables {
		for _, def := range d.queues {
			for name, attrs := range ensuredQueues(t, def) {
				want[name] = true
				t.Run(name, func(t *testing.T) {
					got, ok := declared[name]
					if !ok {
						t.Fatalf("%s's queue %q needs queue %s, which template.yaml does not declare", d.name, def.Name, name)
					}
					checkQueue(t, got, attrs, logicalQueue)
				})
			}
		}
	}
	for name := range declared {
		if !want[name] {
			t.Errorf("template.yaml declares queue %s, which no deployable defines", name)
		}
	}
}

// queueProperties are the properties a declared queue may set: the ones
// pkg/queue sets, its name, and tags. Any other (FIFO, a wait time, a size
// limit) would be a queue the code does not create.
var queueProperties = []string{"QueueName", "Tags", "VisibilityTimeout", "DelaySeconds", "MessageRetentionPeriod", "RedrivePolicy"}

func checkQueue(t *testing.T, got *cfnsqs.Queue, want map[string]string, logicalQueue map[string]string) {
	t.Helper()
	raw, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	var resource struct{ Properties map[string]any }
	if err := json.Unmarshal(raw, &resource); err != nil {
		t.Fatal(err)
	}
	props := resource.Properties
	for k := range props {
		if !slices.Contains(queueProperties, k) {
			t.Errorf("sets %s, which pkg/queue does not", k)
		}
	}
	for prop, attr := range map[string]string{
		"VisibilityTimeout": "VisibilityTimeout", "DelaySeconds": "DelaySeconds", "MessageRetentionPeriod": "MessageRetentionPeriod",
	} {
		v, ok := props[prop].(float64)
		if !ok {
			t.Errorf("%s is not declared; the code sets %s", prop, want[attr])
			continue
		}
		if g := strconv.Itoa(int(v)); g != want[attr] {
			t.Errorf("%s %s, the code sets %s", prop, g, want[attr])
		}
	}
	gotPolicy, wantPolicy := "", ""
	if p, ok := got.RedrivePolicy.(map[string]any); ok {
		target, _ := p["deadLetterTargetArn"].(string)
		count, _ := p["maxReceiveCount"].(float64)
		dlq, ok := logicalQueue[strings.TrimSuffix(strings.TrimPrefix(target, "{{"), ".Arn}}")]
		if !ok {
			t.Errorf("redrive policy targets %q, not a queue of the template", target)
		}
		gotPolicy = fmt.Sprintf("%s after %d receives", dlq, int(count))
	} else if got.RedrivePolicy != nil {
		t.Errorf("redrive policy %v is not an object", got.RedrivePolicy)
	}
	if w := want["RedrivePolicy"]; w != "" {
		var p struct {
			DeadLetterTargetArn string `json:"deadLetterTargetArn"`
			MaxReceiveCount     int    `json:"maxReceiveCount"`
		}
		if err := json.Unmarshal([]byte(w), &p); err != nil {
			t.Fatalf("the code's redrive policy %s: %v", w, err)
		}
		wantPolicy = fmt.Sprintf("%s after %d receives", p.DeadLetterTargetArn[strings.LastIndex(p.DeadLetterTargetArn, ":")+1:], p.MaxReceiveCount)
	}
	if gotPolicy != wantPolicy {
		t.Errorf("redrive policy %q, the code sets %q", gotPolicy, wantPolicy)
	}
}

// ensuredQueues runs pkg/queue's own SQS Ensure for def against a recorder
// that speaks SQS's JSON protocol on 127.0.0.1, and returns the attributes
// each queue it made (def's and its dead-letter queue) ends up with.
func ensuredQueues(t *testing.T, def queue.Definition) map[string]map[string]string {
	t.Helper()
	rec := &sqsRecorder{attrs: map[string]map[string]string{}}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	rec.url = srv.URL
	cfg := aws.Config{
		Region: "us-east-1",
		Credentials: aws.NewCredentialsCache(aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test"}, nil
		})),
		HTTPClient: srv.Client(),
	}
	if err := queue.NewSQS(cfg, srv.URL).Ensure(context.Background(), def); err != nil {
		t.Fatalf("Ensure(%q): %v", def.Name, err)
	}
	return rec.attrs
}

// sqsRecorder answers the SQS calls Ensure makes as SQS does for new
// queues, keeping each queue's attributes.
type sqsRecorder struct {
	url   string
	mu    sync.Mutex
	attrs map[string]map[string]string // queue name → attributes
}

func (r *sqsRecorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	var in struct {
		QueueName  string
		QueueUrl   string
		Attributes map[string]string
	}
	body, err := io.ReadAll(req.Body)
	if err == nil {
		err = json.Unmarshal(body, &in)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	name := in.QueueName
	if name == "" {
		name = in.QueueUrl[strings.LastIndex(in.QueueUrl, "/")+1:]
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var out any = struct{}{}
	switch op := strings.TrimPrefix(req.Header.Get("X-Amz-Target"), "AmazonSQS."); op {
	case "CreateQueue", "SetQueueAttributes":
		if r.attrs[name] == nil {
			r.attrs[name] = map[string]string{}
		}
		maps.Copy(r.attrs[name], in.Attributes)
		if op == "CreateQueue" {
			out = map[string]string{"QueueUrl": r.url + "/123456789012/" + name}
		}
	case "GetQueueUrl":
		out = map[string]string{"QueueUrl": r.url + "/123456789012/" + name}
	case "GetQueueAttributes":
		out = map[string]map[string]string{"Attributes": {"QueueArn": "arn:aws:sqs:us-east-1:123456789012:" + name}}
	default:
		http.Error(w, "the recorder does not answer "+op, http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	_ = json.NewEncoder(w).Encode(out)
}

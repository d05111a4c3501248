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
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
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

// lambdaLogActions are the calls the Lambda service makes with a function's
// role to write its logs; no Conclave code makes them.
var lambdaLogActions = []string{"logs:CreateLogStream", "logs:PutLogEvents"}

// dynamoCalls lists the operations of store.DynamoAPI, the part of the
// DynamoDB client pkg/store's backend uses (its table waiter included), as
// IAM actions.
func dynamoCalls() []string {
	api := reflect.TypeFor[store.DynamoAPI]()
	calls := make([]string, api.NumMethod())
	for i := range calls {
		calls[i] = "dynamodb:" + api.Method(i).Name
	}
	return calls
}

// clientCalls lists the operations a file calls on its AWS client field
// (d.api.X, s.client.X), as IAM actions of service: the most any role may
// be granted. A batch call is authorised by its single action.
func clientCalls(t *testing.T, file, field, service string) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(repoRoot, file), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var calls []string
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		method, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		if recv, ok := method.X.(*ast.SelectorExpr); ok && recv.Sel.Name == field {
			op := method.Sel.Name
			if service == "sqs" {
				op = strings.TrimSuffix(op, "Batch")
			}
			calls = append(calls, service+":"+op)
		}
		return true
	})
	if len(calls) == 0 {
		t.Fatalf("found no %s calls in %s: has the client field been renamed from %q?", service, file, field)
	}
	slices.Sort(calls)
	return slices.Compact(calls)
}

func TestRolesLeastPrivilege(t *testing.T) {
	tmpl := openTemplate(t)
	allowed := slices.Concat(
		dynamoCalls(),
		clientCalls(t, "pkg/queue/sqs.go", "client", "sqs"),
		lambdaLogActions)

	// What each logical resource belongs to: one deployable, or several for
	// a queue they share (the bus's events queue, which the runner and the
	// Librarian send to).
	owner := map[string]map[string]bool{} // logical ID → deployables
	own := func(id, name string) {
		if owner[id] == nil {
			owner[id] = map[string]bool{}
		}
		owner[id][name] = true
	}
	tableIDs := map[string]string{}
	for id, table := range tmpl.GetAllDynamoDBTableResources() {
		tableIDs[aws.ToString(table.TableName)] = id
	}
	queueIDs := map[string]string{}
	for id, q := range tmpl.GetAllSQSQueueResources() {
		queueIDs[aws.ToString(q.QueueName)] = id
	}
	mustReach := map[string][]string{} // deployable → logical IDs its role must name
	for _, d := range deployables {
		for _, table := range d.tables {
			id := tableIDs[tmpl.prefix+table.Name]
			own(id, d.name)
			mustReach[d.name] = append(mustReach[d.name], id)
		}
		for _, def := range d.queues {
			own(queueIDs[def.Name], d.name)
			mustReach[d.name] = append(mustReach[d.name], queueIDs[def.Name])
			for name := range ensuredQueues(t, def) {
				own(queueIDs[name], d.name)
			}
		}
	}
	// A function's log group belongs to the deployable whose role it runs with.
	logGroupIDs := map[string]string{}
	for id, g := range tmpl.GetAllLogsLogGroupResources() {
		logGroupIDs[aws.ToString(g.LogGroupName)] = id
	}
	for _, fn := range tmpl.GetAllServerlessFunctionResources() {
		for _, d := range deployables {
			if aws.ToString(fn.Role) == "{{"+d.role+".Arn}}" {
				own(logGroupIDs["/aws/lambda/"+aws.ToString(fn.FunctionName)], d.name)
			}
		}
	}

	roles := tmpl.GetAllIAMRoleResources()
	var wantRoles []string
	for _, d := range deployables {
		wantRoles = append(wantRoles, d.role)
		t.Run(d.name, func(t *testing.T) {
			role, ok := roles[d.role]
			if !ok {
				t.Fatalf("template.yaml has no role %s for %s", d.role, d.name)
			}
			if s, ok := role.AssumeRolePolicyDocument.(string); ok {
				checkIRSATrust(t, s, d.name)
			}
			if len(role.ManagedPolicyArns) > 0 {
				t.Errorf("attaches managed policies %v, which grant more than the code calls", role.ManagedPolicyArns)
			}
			reached := map[string]bool{}
			for _, p := range role.Policies {
				for _, st := range statements(t, p.PolicyDocument) {
					if st.Effect != "Allow" {
						continue
					}
					for _, a := range st.Action {
						if !slices.Contains(allowed, a) {
							t.Errorf("policy %s grants %s, which no Conclave AWS client calls (they call %v)", p.PolicyName, a, allowed)
						}
					}
					for _, r := range st.Resource {
						id := strings.TrimSuffix(strings.TrimPrefix(r, "{{"), ".Arn}}")
						if !strings.HasPrefix(r, "{{") || !owner[id][d.name] {
							t.Errorf("policy %s reaches %s, which is not one of %s's tables, queues or log groups", p.PolicyName, r, d.name)
						}
						reached[id] = true
					}
				}
			}
			for _, id := range mustReach[d.name] {
				if !reached[id] {
					t.Errorf("does not reach %s, which %s uses", id, d.name)
				}
			}
		})
	}
	for id := range roles {
		if !slices.Contains(wantRoles, id) {
			t.Errorf("template.yaml declares role %s, which belongs to no deployable", id)
		}
	}
}

// checkIRSATrust checks the trust policy of a role assumed by pods through
// IRSA (a JSON string, since its condition keys are named after the
// cluster's OIDC issuer): web identity only, and only for the deployable's
// own ServiceAccount, which the chart names conclave-<deployable>.
func checkIRSATrust(t *testing.T, doc, name string) {
	t.Helper()
	var trust struct {
		Statement []struct {
			Effect    string
			Action    string
			Principal struct{ Federated string }
			Condition struct{ StringEquals map[string]string }
		}
	}
	if err := json.Unmarshal([]byte(doc), &trust); err != nil {
		t.Fatalf("the trust policy is not valid JSON: %v\n%s", err, doc)
	}
	if len(trust.Statement) != 1 {
		t.Fatalf("the trust policy has %d statements, want one", len(trust.Statement))
	}
	st := trust.Statement[0]
	if st.Effect != "Allow" || st.Action != "sts:AssumeRoleWithWebIdentity" || !strings.Contains(st.Principal.Federated, ":oidc-provider/") {
		t.Errorf("the trust policy lets %q do %s %s; want an OIDC provider to AssumeRoleWithWebIdentity", st.Principal.Federated, st.Effect, st.Action)
	}
	var sub, aud string
	for k, v := range st.Condition.StringEquals {
		switch {
		case strings.HasSuffix(k, ":sub"):
			sub = v
		case strings.HasSuffix(k, ":aud"):
			aud = v
		}
	}
	if want := "system:serviceaccount:conclave:conclave-" + name; sub != want || aud != "sts.amazonaws.com" {
		t.Errorf("the trust policy admits subject %q, audience %q; with the default parameters want %q and sts.amazonaws.com", sub, aud, want)
	}
}

// statement is an IAM policy statement with Action and Resource as lists.
type statement struct {
	Effect   string
	Action   []string
	Resource []string
}

func statements(t *testing.T, doc any) []statement {
	t.Helper()
	raw, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	var d struct{ Statement []map[string]any }
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("policy document %s: %v", raw, err)
	}
	var out []statement
	for _, s := range d.Statement {
		for _, k := range []string{"NotAction", "NotResource", "Principal", "NotPrincipal"} {
			if _, ok := s[k]; ok {
				t.Errorf("a role policy statement uses %s: list what it allows instead", k)
			}
		}
		effect, _ := s["Effect"].(string)
		out = append(out, statement{Effect: effect, Action: stringList(s["Action"]), Resource: stringList(s["Resource"])})
	}
	return out
}

func stringList(v any) []string {
	switch v := v.(type) {
	case string:
		return []string{v}
	case []any:
		out := make([]string, 0, len(v))
		for _, e := range v {
			out = append(out, fmt.Sprint(e))
		}
		return out
	}
	return nil
}

// servedRoutes finds the "METHOD /path" patterns the Librarian's handler
// registers (mux.HandleFunc calls in its non-test sources), leaving out the
// catch-all "/" that answers 404 and 405.
func servedRoutes(t *testing.T) []string {
	t.Helper()
	var routes []string
	root := filepath.Join(repoRoot, "functions/librarian")
	err := filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() && e.Name() == "testdata" {
			return filepath.SkipDir
		}
		if e.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) == 0 {
				return true
			}
			if sel, ok := call.Fun.(*ast.SelectorExpr); !ok || (sel.Sel.Name != "HandleFunc" && sel.Sel.Name != "Handle") {
				return true
			}
			lit, ok := call.Args[0].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			if pattern, err := strconv.Unquote(lit.Value); err == nil && strings.Contains(pattern, " ") {
				routes = append(routes, pattern)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(routes)
	return routes
}

func TestLibrarianFunctionAndRoutes(t *testing.T) {
	tmpl := openTemplate(t)
	fns := tmpl.GetAllServerlessFunctionResources()
	fn, ok := fns["LibrarianFunction"]
	if !ok || len(fns) != 1 {
		t.Fatalf("want exactly one function, LibrarianFunction; the template has %v", slices.Collect(maps.Keys(fns)))
	}
	for what, pair := range map[string][2]string{
		"runtime":      {aws.ToString(fn.Runtime), "provided.al2023"},
		"handler":      {aws.ToString(fn.Handler), "bootstrap"},
		"architecture": {strings.Join(fn.Architectures, ","), "arm64"},
		"role":         {aws.ToString(fn.Role), "{{LibrarianRole.Arn}}"},
	} {
		if pair[0] != pair[1] {
			t.Errorf("LibrarianFunction %s is %q, want %q", what, pair[0], pair[1])
		}
	}
	var env map[string]string
	if fn.Environment != nil {
		env = fn.Environment.Variables
	}
	// lambdafn refuses any backend but aws, and the tables are found by prefix.
	if env["CONCLAVE_BACKEND"] != "aws" || env["CONCLAVE_TABLE_PREFIX"] != tmpl.prefix {
		t.Errorf("LibrarianFunction environment %v: want CONCLAVE_BACKEND=aws and CONCLAVE_TABLE_PREFIX=%q (the Prefix parameter)", env, tmpl.prefix)
	}

	// Every route goes to the one integration, which proxies to the function.
	integrations := tmpl.GetAllApiGatewayV2IntegrationResources()
	for id, in := range integrations {
		if in.IntegrationType != "AWS_PROXY" || aws.ToString(in.IntegrationUri) != "{{LibrarianFunction.Arn}}" || in.ApiId != "{{ref LibrarianApi}}" {
			t.Errorf("integration %s: %s to %q on %q, want AWS_PROXY to LibrarianFunction on LibrarianApi", id, in.IntegrationType, aws.ToString(in.IntegrationUri), in.ApiId)
		}
	}
	var routes []string
	defaults := 0
	for id, r := range tmpl.GetAllApiGatewayV2RouteResources() {
		target := strings.TrimPrefix(aws.ToString(r.Target), "integrations/{{ref ")
		if _, ok := integrations[strings.TrimSuffix(target, "}}")]; !ok || r.ApiId != "{{ref LibrarianApi}}" {
			t.Errorf("route %s on %q targets %q, not an integration of the template on LibrarianApi", id, r.ApiId, aws.ToString(r.Target))
		}
		if r.RouteKey == "$default" {
			defaults++
			continue
		}
		routes = append(routes, r.RouteKey)
	}
	slices.Sort(routes)
	if served := servedRoutes(t); !slices.Equal(routes, served) {
		t.Errorf("the HTTP API routes\n%v\nthe handler serves\n%v", routes, served)
	}
	if defaults != 1 {
		t.Errorf("%d $default routes; want one, so unmatched requests get the handler's own 404 and 405", defaults)
	}
}

func TestLogGroupsRetention(t *testing.T) {
	tmpl := openTemplate(t)
	groups := tmpl.GetAllLogsLogGroupResources()
	arns := map[string]bool{}
	names := map[string]bool{}
	for id, g := range groups {
		if g.RetentionInDays == nil {
			t.Errorf("log group %s keeps logs forever; set RetentionInDays", id)
		}
		arns["{{"+id+".Arn}}"] = true
		names[aws.ToString(g.LogGroupName)] = true
	}
	used := 0
	for id, fn := range tmpl.GetAllServerlessFunctionResources() {
		if want := "/aws/lambda/" + aws.ToString(fn.FunctionName); !names[want] {
			t.Errorf("function %s logs to %s, which the template does not declare (Lambda would create it with no retention)", id, want)
		} else {
			used++
		}
	}
	for id, stage := range tmpl.GetAllApiGatewayV2StageResources() {
		if stage.AccessLogSettings == nil || !arns[aws.ToString(stage.AccessLogSettings.DestinationArn)] {
			t.Errorf("API stage %s does not write access logs to a log group of the template", id)
		} else {
			used++
		}
	}
	if used != len(groups) {
		t.Errorf("%d log groups, %d used by a function or an API stage", len(groups), used)
	}
}

// TestLibrarianSweepSchedule: EventBridge invokes the Librarian on a
// schedule, so that escalations nobody reads expire (lambdafn's
// withSchedule), and is the only principal besides API Gateway allowed to.
func TestLibrarianSweepSchedule(t *testing.T) {
	tmpl := openTemplate(t)
	var schedule string
	for id, rule := range tmpl.GetAllEventsRuleResources() {
		if len(rule.Targets) != 1 || rule.Targets[0].Arn != "{{LibrarianFunction.Arn}}" {
			t.Errorf("rule %s targets %v, want LibrarianFunction alone", id, rule.Targets)
			continue
		}
		if expr := aws.ToString(rule.ScheduleExpression); !strings.HasPrefix(expr, "rate(") || aws.ToString(rule.State) != "ENABLED" || rule.EventPattern != nil {
			t.Errorf("rule %s: schedule %q, state %q, pattern %v; want an enabled rate() schedule", id, expr, aws.ToString(rule.State), rule.EventPattern)
		}
		schedule = id
	}
	if schedule == "" {
		t.Fatal("no EventBridge schedule invokes LibrarianFunction: escalations nobody reads would never expire")
	}
	principals := map[string]string{}
	for id, p := range tmpl.GetAllLambdaPermissionResources() {
		if p.Action != "lambda:InvokeFunction" || p.FunctionName != "{{ref LibrarianFunction}}" {
			t.Errorf("permission %s: %s on %s", id, p.Action, p.FunctionName)
		}
		principals[p.Principal] = aws.ToString(p.SourceArn)
	}
	if got := principals["events.amazonaws.com"]; got != "{{"+schedule+".Arn}}" {
		t.Errorf("EventBridge may invoke the function from %q, want the schedule %s only", got, schedule)
	}
	if len(principals) != 2 || principals["apigateway.amazonaws.com"] == "" {
		t.Errorf("principals allowed to invoke the function: %v; want API Gateway and the schedule", principals)
	}
}

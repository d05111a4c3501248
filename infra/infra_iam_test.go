package infra

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/conclave-ai/conclave/pkg/store"
)

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

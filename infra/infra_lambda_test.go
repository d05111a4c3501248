package infra

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
)

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

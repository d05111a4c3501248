package api

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/testenv"
	runnerv1 "github.com/conclave-ai/conclave/proto/conclave/runner/v1"
	"github.com/conclave-ai/conclave/services/runner/internal/records"
)

// dynalite serves the tests that run on DynamoDB; nil with -short.
var dynalite *testenv.Component

func TestMain(m *testing.M) {
	os.Exit(testenv.RunWith(m, testenv.Dynalite, &dynalite))
}

// listStores are the backends ListAgents is tested on: the embedded store
// and DynamoDB on dynalite (left out with -short).
func listStores(t *testing.T) map[string]store.Store {
	t.Helper()
	return testenv.Stores(t, dynalite, records.Table)
}

// listAll follows next_page_token to the end and returns the ids listed.
func listAll(t *testing.T, s *Server, req *runnerv1.ListAgentsRequest) (ids []string, pages int) {
	t.Helper()
	for {
		resp, err := s.ListAgents(context.Background(), req)
		if err != nil {
			t.Fatalf("ListAgents(%v): %v", req, err)
		}
		pages++
		if len(resp.GetInstances()) > int(max(req.GetPageSize(), DefaultListPageSize)) && req.GetPageSize() != 0 {
			t.Fatalf("page of %d instances, page_size %d", len(resp.GetInstances()), req.GetPageSize())
		}
		for _, in := range resp.GetInstances() {
			ids = append(ids, in.GetId())
		}
		if resp.GetNextPageToken() == "" {
			return ids, pages
		}
		if pages > 100 {
			t.Fatal("the listing does not end")
		}
		req.PageToken = resp.GetNextPageToken()
	}
}

// ListAgents lists instances newest first, on both stores: every page size
// gives every instance once, in order; the filters keep what they name;
// a deleted instance (marked, or removed) is gone from the list.
func TestListAgents(t *testing.T) {
	t.Parallel()
	for name, st := range listStores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			rec := records.New(st)
			s := &Server{rec: rec}
			base := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
			statuses := []string{records.StatusRunning, records.StatusCompleted, records.StatusFailed}
			var newestFirst []string
			for i := range 9 {
				in := &records.Instance{ID: fmt.Sprintf("inst-%02d", i), TaskID: "task", AgentType: []string{"alpha", "beta"}[i%2],
					Status: statuses[i%3], StartedAt: base.Add(time.Duration(i) * time.Second)}
				if err := rec.CreateInstance(ctx, in); err != nil {
					t.Fatal(err)
				}
				newestFirst = append([]string{in.ID}, newestFirst...)
			}
			keep := func(f func(i int) bool) []string {
				var out []string
				for _, id := range newestFirst {
					var i int
					fmt.Sscanf(id, "inst-%d", &i)
					if f(i) {
						out = append(out, id)
					}
				}
				return out
			}
			for _, c := range []struct {
				name      string
				req       *runnerv1.ListAgentsRequest
				want      []string
				wantPages int
			}{
				{"all on one page", &runnerv1.ListAgentsRequest{}, newestFirst, 1},
				{"page of 1", &runnerv1.ListAgentsRequest{PageSize: 1}, newestFirst, 9},
				{"pages of 4", &runnerv1.ListAgentsRequest{PageSize: 4}, newestFirst, 3},
				{"exactly one page", &runnerv1.ListAgentsRequest{PageSize: 9}, newestFirst, 1},
				{"status", &runnerv1.ListAgentsRequest{Status: records.StatusCompleted, PageSize: 2}, keep(func(i int) bool { return i%3 == 1 }), 2},
				{"agent_type", &runnerv1.ListAgentsRequest{AgentType: "beta", PageSize: 3}, keep(func(i int) bool { return i%2 == 1 }), 2},
				{"both", &runnerv1.ListAgentsRequest{AgentType: "alpha", Status: records.StatusRunning}, keep(func(i int) bool { return i%2 == 0 && i%3 == 0 }), 1},
				{"none match", &runnerv1.ListAgentsRequest{AgentType: "gamma"}, nil, 1},
			} {
				got, pages := listAll(t, s, c.req)
				if !slices.Equal(got, c.want) {
					t.Errorf("%s: listed %v, want %v", c.name, got, c.want)
				}
				if c.wantPages != 0 && pages > c.wantPages {
					t.Errorf("%s: %d pages, want at most %d", c.name, pages, c.wantPages)
				}
			}

			// Deleted: marked (a deletion in progress) and removed.
			if _, err := rec.UpdateInstance(ctx, "inst-08", func(in *records.Instance) error { in.Deleted = true; return nil }); err != nil {
				t.Fatal(err)
			}
			if err := rec.DeleteInstance(ctx, "inst-03"); err != nil {
				t.Fatal(err)
			}
			got, _ := listAll(t, s, &runnerv1.ListAgentsRequest{PageSize: 2})
			want := slices.DeleteFunc(slices.Clone(newestFirst), func(id string) bool { return id == "inst-08" || id == "inst-03" })
			if !slices.Equal(got, want) {
				t.Errorf("after deletions: listed %v, want %v", got, want)
			}
			// Each item has GetAgentStatus's shape and content.
			resp, err := s.ListAgents(ctx, &runnerv1.ListAgentsRequest{PageSize: 1})
			if err != nil {
				t.Fatal(err)
			}
			one, err := s.GetAgentStatus(ctx, &runnerv1.GetAgentStatusRequest{InstanceId: "inst-07"})
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.GetInstances()) != 1 || resp.GetInstances()[0].String() != one.GetInstance().String() {
				t.Errorf("listed %v, status says %v", resp.GetInstances(), one.GetInstance())
			}
		})
	}
}

// Requests ListAgents refuses, each with InvalidArgument and a
// validation_error.
func TestListAgentsInvalid(t *testing.T) {
	t.Parallel()
	s := &Server{rec: followRecords(t)}
	ctx := context.Background()
	valid := listToken{After: fmt.Sprintf("%020d#x", 1), Status: "running"}.encode()
	for _, c := range []struct {
		name string
		req  *runnerv1.ListAgentsRequest
	}{
		{"negative page_size", &runnerv1.ListAgentsRequest{PageSize: -1}},
		{"page_size over the max", &runnerv1.ListAgentsRequest{PageSize: MaxListPageSize + 1}},
		{"unknown status", &runnerv1.ListAgentsRequest{Status: "sleeping"}},
		{"malformed agent_type", &runnerv1.ListAgentsRequest{AgentType: "a/b"}},
		{"token not base64", &runnerv1.ListAgentsRequest{PageToken: "not a token!"}},
		{"token not JSON", &runnerv1.ListAgentsRequest{PageToken: "bm90IGpzb24"}},
		{"token without a position", &runnerv1.ListAgentsRequest{PageToken: listToken{}.encode()}},
		{"token with a bad position", &runnerv1.ListAgentsRequest{PageToken: listToken{After: "12#x"}.encode()}},
		{"token for other filters", &runnerv1.ListAgentsRequest{PageToken: valid}},
		{"token for other filters too", &runnerv1.ListAgentsRequest{PageToken: valid, Status: "running", AgentType: "x"}},
	} {
		_, err := s.ListAgents(ctx, c.req)
		if status.Code(err) != codes.InvalidArgument || errorBody(err).Error != CodeValidation {
			t.Errorf("%s: got %v, want InvalidArgument with %s", c.name, err, CodeValidation)
		}
	}
	if _, err := s.ListAgents(ctx, &runnerv1.ListAgentsRequest{PageToken: valid, Status: "running"}); err != nil {
		t.Errorf("a good token: %v", err)
	}
}

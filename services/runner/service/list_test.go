package service_test

import (
	"net/http"
	"slices"
	"testing"
)

type listResponse struct {
	Instances     []instance `json:"instances"`
	NextPageToken string     `json:"next_page_token"`
}

// TestListAgents: GET /api/v1/agents lists launched instances newest
// first, a page at a time, with the status response's fields; a filter
// keeps what it names; a bad page_token is a 400 validation_error; a
// deleted instance is gone; it needs a token like every call.
func TestListAgents(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a runner")
	}
	t.Parallel()
	r := startRunner(t, map[string]string{"CONCLAVE_RUNNER_ALLOW_UNAUTHENTICATED": "false", "CONCLAVE_RUNNER_CLIENT_TOKENS": "s3cret-0123456789abc"})
	var e errorBody
	if code := r.Do(t, "GET", "/api/v1/agents", nil, &e); code != http.StatusUnauthorized {
		t.Fatalf("without a token: %d %+v", code, e)
	}
	r.Token = "s3cret-0123456789abc"
	var empty listResponse
	if code := r.Do(t, "GET", "/api/v1/agents", nil, &empty); code != http.StatusOK || empty.Instances == nil || len(empty.Instances) != 0 || empty.NextPageToken != "" {
		t.Fatalf("nothing launched: %d %+v", code, empty)
	}
	ws := r.workspace(t)
	var launched []string // newest first
	for _, typ := range []string{"acp-normal", "acp-hang", "acp-normal"} {
		in := r.Launch(t, typ, ws, nil)
		launched = append([]string{in.ID}, launched...)
	}
	r.WaitStatus(t, launched[0], "running", "completed")

	var ids []string
	path := "/api/v1/agents?page_size=2"
	for pages := 0; ; pages++ {
		var page listResponse
		if code := r.Do(t, "GET", path, nil, &page); code != http.StatusOK {
			t.Fatalf("GET %s: %d", path, code)
		}
		if len(page.Instances) > 2 || pages > 3 {
			t.Fatalf("GET %s: %+v", path, page)
		}
		for _, in := range page.Instances {
			ids = append(ids, in.ID)
			if in.TaskID == "" || in.AgentType == "" || in.StartedAt == "" || in.Status == "" {
				t.Errorf("listed %+v", in)
			}
		}
		if page.NextPageToken == "" {
			break
		}
		path = "/api/v1/agents?page_size=2&page_token=" + page.NextPageToken
	}
	if !slices.Equal(ids, launched) {
		t.Fatalf("listed %v, want %v", ids, launched)
	}

	var hang listResponse
	if code := r.Do(t, "GET", "/api/v1/agents?agent_type=acp-hang", nil, &hang); code != http.StatusOK || len(hang.Instances) != 1 || hang.Instances[0].ID != launched[1] {
		t.Fatalf("agent_type=acp-hang: %d %+v", code, hang)
	}

	for _, bad := range []string{"page_token=garbage", "page_size=1000", "status=sleeping", "page_size=x"} {
		var e errorBody
		if code := r.Do(t, "GET", "/api/v1/agents?"+bad, nil, &e); code != http.StatusBadRequest || e.HTTPStatus != 400 || e.Error == "" || e.Message == "" {
			t.Errorf("?%s: %d %+v", bad, code, e)
		}
	}

	if code := r.Do(t, "DELETE", "/api/v1/agents/"+launched[1], nil, nil); code != http.StatusOK {
		t.Fatalf("delete: %d", code)
	}
	var after listResponse
	if code := r.Do(t, "GET", "/api/v1/agents", nil, &after); code != http.StatusOK {
		t.Fatalf("list after delete: %d", code)
	}
	ids = nil
	for _, in := range after.Instances {
		ids = append(ids, in.ID)
	}
	if want := []string{launched[0], launched[2]}; !slices.Equal(ids, want) {
		t.Fatalf("after deleting %s: listed %v, want %v", launched[1], ids, want)
	}
}

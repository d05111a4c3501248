package history_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/testenv"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
	covenpb "github.com/conclave-ai/conclave/proto/coven"
	"github.com/conclave-ai/conclave/services/gateway/internal/history"
)

// dynalite is the DynamoDB the second backend runs on; nil under -short.
var dynalite *testenv.Component

func TestMain(m *testing.M) {
	os.Exit(testenv.RunWith(m, testenv.Dynalite, &dynalite))
}

// countingStore counts the writes that reach the store.
type countingStore struct {
	store.Store
	writes atomic.Int64
}

func (c *countingStore) Put(ctx context.Context, table string, it store.Item, conds ...store.Condition) (store.Item, error) {
	c.writes.Add(1)
	return c.Store.Put(ctx, table, it, conds...)
}

func (c *countingStore) Delete(ctx context.Context, table string, k store.Key, conds ...store.Condition) error {
	c.writes.Add(1)
	return c.Store.Delete(ctx, table, k, conds...)
}

// eachStore runs fn on the embedded store and on DynamoDB (dynalite).
func eachStore(t *testing.T, fn func(t *testing.T, st *countingStore)) {
	t.Helper()
	t.Parallel()
	if dynalite == nil && !testing.Short() {
		t.Fatal("dynalite not started")
	}
	for name, st := range testenv.Stores(t, dynalite, history.Table) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, &countingStore{Store: st})
		})
	}
}

func text(s string) *covenpb.MessageResponse {
	return &covenpb.MessageResponse{Event: &covenpb.MessageResponse_Text{Text: s}}
}

func done(s string) *covenpb.MessageResponse {
	return &covenpb.MessageResponse{Event: &covenpb.MessageResponse_Done{Done: &covenpb.Done{FullResponse: s}}}
}

var doneOutcome = &gatewayv1.Outcome{Ending: gatewayv1.Ending_ENDING_DONE}

// describe is an entry as one short string, for comparisons.
func describe(e *gatewayv1.ThreadEntry) string {
	switch x := e.GetEntry().(type) {
	case *gatewayv1.ThreadEntry_Message:
		return "message:" + x.Message.GetContent()
	case *gatewayv1.ThreadEntry_Event:
		switch {
		case x.Event.GetDone() != nil:
			return "done:" + x.Event.GetDone().GetFullResponse()
		case x.Event.GetFile() != nil:
			return fmt.Sprintf("file:%s:%d", x.Event.GetFile().GetFilename(), len(x.Event.GetFile().GetData()))
		}
		return "text:" + x.Event.GetText()
	case *gatewayv1.ThreadEntry_Outcome:
		return "outcome:" + x.Outcome.GetEnding().String()
	}
	return "?"
}

func describeAll(es []*gatewayv1.ThreadEntry) string {
	var parts []string
	for _, e := range es {
		parts = append(parts, describe(e))
	}
	return strings.Join(parts, "|")
}

// exchange records one request of content answered by texts and done.
func exchange(t *testing.T, h *history.Store, thread, requestID, content string, texts ...string) *history.Recording {
	t.Helper()
	ctx := context.Background()
	if err := h.Join(ctx, thread, "client-a", "agent-1"); err != nil {
		t.Fatal(err)
	}
	rec, err := h.Begin(history.Exchange{ThreadID: thread, RequestID: requestID, AgentID: "agent-1", ClientID: "client-a", Sender: "ann", Content: content})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range texts {
		if _, err := rec.Append(ctx, text(s), false); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := rec.End(ctx, done(content), doneOutcome); err != nil {
		t.Fatal(err)
	}
	return rec
}

func TestExchangeIsStoredInOneWrite(t *testing.T) {
	eachStore(t, func(t *testing.T, st *countingStore) {
		h := history.New(st, history.Options{TTL: time.Hour})
		ctx := context.Background()
		if err := h.Join(ctx, "th-1", "client-a", "agent-1"); err != nil {
			t.Fatal(err)
		}
		before := st.writes.Load()
		rec, err := h.Begin(history.Exchange{ThreadID: "th-1", RequestID: "gw.1", AgentID: "agent-1", ClientID: "client-a",
			Sender: "ann", Content: "hello", Attachments: []*covenpb.FileAttachment{{Filename: "a.txt", MimeType: "text/plain", Data: []byte("abc")}}})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 100 {
			if _, err := rec.Append(ctx, text(fmt.Sprint("t", i)), false); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := rec.Append(ctx, &covenpb.MessageResponse{Event: &covenpb.MessageResponse_File{File: &covenpb.FileData{Filename: "out.bin", MimeType: "application/octet-stream", Data: make([]byte, 1000)}}}, false); err != nil {
			t.Fatal(err)
		}
		if n := st.writes.Load() - before; n != 0 || rec.Stored() {
			t.Fatalf("before the end: %d writes, message stored %v; want none", n, rec.Stored())
		}
		if _, err := rec.End(ctx, done("hello"), doneOutcome); err != nil {
			t.Fatal(err)
		}
		if n := st.writes.Load() - before; n != 1 {
			t.Fatalf("a message and 103 entries of its answer took %d writes, want 1", n)
		}
		if h.Live("gw.1") != nil {
			t.Fatal("an ended recording is still live")
		}
		entries, more, err := h.Entries(ctx, "th-1", "", 1000)
		if err != nil || more {
			t.Fatalf("entries: more=%v %v", more, err)
		}
		if len(entries) != 1+100+1+2 {
			t.Fatalf("%d entries: %s", len(entries), describeAll(entries))
		}
		m := entries[0]
		if m.GetMessage().GetContent() != "hello" || m.GetMessage().GetClientId() != "client-a" || m.GetRequestId() != "gw.1" ||
			m.GetAgentId() != "agent-1" || m.GetThreadId() != "th-1" || m.GetEntryId() != rec.Message().String() {
			t.Fatalf("message entry: %v", m)
		}
		att := m.GetMessage().GetAttachments()
		if len(att) != 1 || att[0].GetFilename() != "a.txt" || att[0].GetSize() != 3 ||
			att[0].GetSha256() != "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" {
			t.Fatalf("attachment ref: %v", att)
		}
		file := entries[101]
		if describe(file) != "file:out.bin:0" || file.GetFile().GetSize() != 1000 {
			t.Fatalf("file entry keeps its data or loses its ref: %v", file)
		}
		if got := describeAll(entries[102:]); got != "done:hello|outcome:ENDING_DONE" {
			t.Fatalf("end: %s", got)
		}
		for i := 1; i < len(entries); i++ {
			if entries[i-1].GetEntryId() >= entries[i].GetEntryId() {
				t.Fatalf("entry ids out of order: %s then %s", entries[i-1].GetEntryId(), entries[i].GetEntryId())
			}
		}
	})
}

func TestEntriesPageAndResumeAfter(t *testing.T) {
	eachStore(t, func(t *testing.T, st *countingStore) {
		// Batches of about three entries, so that pages and cursors fall
		// inside items.
		h := history.New(st, history.Options{FlushBytes: 100})
		var want []string
		for r := range 3 {
			var texts []string
			for i := range 7 {
				texts = append(texts, fmt.Sprintf("r%d-%d-%s", r, i, strings.Repeat("x", 20)))
			}
			content := fmt.Sprint("question ", r)
			exchange(t, h, "th-page", fmt.Sprintf("gw.%d", r), content, texts...)
			want = append(want, "message:"+content)
			for _, s := range texts {
				want = append(want, "text:"+s)
			}
			want = append(want, "done:"+content, "outcome:ENDING_DONE")
			// A later request starts in a later millisecond.
			time.Sleep(2 * time.Millisecond)
		}
		ctx := context.Background()
		for _, size := range []int{1, 2, 5, 11, 100} {
			var got []*gatewayv1.ThreadEntry
			after := ""
			for {
				page, more, err := h.Entries(ctx, "th-page", after, size)
				if err != nil {
					t.Fatal(err)
				}
				if len(page) > size {
					t.Fatalf("page of %d entries, asked %d", len(page), size)
				}
				got = append(got, page...)
				if !more {
					break
				}
				after = page[len(page)-1].GetEntryId()
			}
			if describeAll(got) != strings.Join(want, "|") {
				t.Fatalf("pages of %d:\n got %s\nwant %s", size, describeAll(got), strings.Join(want, "|"))
			}
			// Resuming after any entry gives exactly what follows it.
			for i := range got {
				rest, _, err := h.Entries(ctx, "th-page", got[i].GetEntryId(), 1000)
				if err != nil {
					t.Fatal(err)
				}
				if describeAll(rest) != strings.Join(want[i+1:], "|") {
					t.Fatalf("after entry %d: %s", i, describeAll(rest))
				}
			}
		}
		if _, _, err := h.Entries(ctx, "th-page", "not-an-entry", 10); !errors.Is(err, history.ErrBadCursor) {
			t.Fatalf("a malformed after: %v", err)
		}
	})
}

func TestOversizedEntryIsSplitIntoParts(t *testing.T) {
	eachStore(t, func(t *testing.T, st *countingStore) {
		h := history.New(st, history.Options{})
		big := strings.Repeat("0123456789", 90_000) // 900 KB: three items
		rec := exchange(t, h, "th-big", "gw.big", "q", "small", big, "after")
		entries, _, err := h.Entries(context.Background(), "th-big", "", 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 6 || entries[2].GetEvent().GetText() != big || describe(entries[3]) != "text:after" {
			t.Fatalf("%d entries; the big one has %d bytes", len(entries), len(entries[2].GetEvent().GetText()))
		}
		// Resuming at and around it.
		for _, after := range []*gatewayv1.ThreadEntry{entries[1], entries[2]} {
			rest, _, err := h.Entries(context.Background(), "th-big", after.GetEntryId(), 100)
			if err != nil {
				t.Fatal(err)
			}
			if rest[0].GetEntryId() <= after.GetEntryId() || len(rest) != 5-indexOf(entries, after) {
				t.Fatalf("after %s: %d entries", after.GetEntryId(), len(rest))
			}
		}
		sub, _, err := h.RequestEntries(context.Background(), "th-big", rec.Message(), 2, 10)
		if err != nil || len(sub) != 4 || sub[0].GetEvent().GetText() != big {
			t.Fatalf("request entries from 2: %d, %v", len(sub), err)
		}
	})
}

func indexOf(es []*gatewayv1.ThreadEntry, e *gatewayv1.ThreadEntry) int {
	for i := range es {
		if es[i] == e {
			return i
		}
	}
	return -1
}

func TestLargeBatchIsSplitIntoItems(t *testing.T) {
	eachStore(t, func(t *testing.T, st *countingStore) {
		// Nothing is written before the end: one batch of 1 MB, which
		// takes items of at most 380 KB, whole entries each.
		h := history.New(st, history.Options{FlushBytes: 4 << 20})
		var texts []string
		for i := range 10 {
			texts = append(texts, fmt.Sprint(i)+strings.Repeat("x", 100_000))
		}
		if err := h.Join(context.Background(), "th-batch", "client-a", "agent-1"); err != nil {
			t.Fatal(err)
		}
		before := st.writes.Load()
		exchange(t, h, "th-batch", "gw.batch", "q", texts...)
		if n := st.writes.Load() - before; n != 4 {
			t.Fatalf("1 MB of entries took %d writes, want 4 items", n)
		}
		entries, _, err := h.Entries(context.Background(), "th-batch", "", 100)
		if err != nil {
			t.Fatal(err)
		}
		want := []string{"message:q"}
		for _, s := range texts {
			want = append(want, "text:"+s)
		}
		want = append(want, "done:q", "outcome:ENDING_DONE")
		if got := describeAll(entries); got != strings.Join(want, "|") {
			t.Fatalf("%d entries, want %d", len(entries), len(want))
		}
	})
}

func TestSubscribersGetMissedEntriesThenLive(t *testing.T) {
	eachStore(t, func(t *testing.T, st *countingStore) {
		// Every entry is written at once, and memory keeps none that every
		// subscriber has read: a late subscriber reads the store.
		h := history.New(st, history.Options{FlushBytes: 1})
		ctx := context.Background()
		if err := h.Join(ctx, "th-live", "client-a", "agent-1"); err != nil {
			t.Fatal(err)
		}
		rec, err := h.Begin(history.Exchange{ThreadID: "th-live", RequestID: "gw.live", AgentID: "agent-1", ClientID: "client-a", Content: "q"})
		if err != nil {
			t.Fatal(err)
		}
		if h.Live("gw.live") != rec {
			t.Fatal("the recording is not live")
		}
		first := rec.Subscribe(0)
		for i := range 5 {
			if _, err := rec.Append(ctx, text(fmt.Sprint("early", i)), false); err != nil {
				t.Fatal(err)
			}
		}
		got, err := first.Next(ctx)
		if err != nil || len(got) != 6 {
			t.Fatalf("first subscriber: %s %v", describeAll(got), err)
		}
		first.Close()
		// Nobody holds the early entries any more: a subscriber from 2
		// reads them from the store, then the rest as it comes.
		late := rec.Subscribe(2)
		defer late.Close()
		got, err = late.Next(ctx)
		if err != nil || describeAll(got) != "text:early1|text:early2|text:early3|text:early4" {
			t.Fatalf("late subscriber, missed part: %s %v", describeAll(got), err)
		}
		go func() {
			_, _ = rec.Append(ctx, text("live"), false)
			_, _ = rec.End(ctx, done("q"), doneOutcome)
		}()
		var rest []*gatewayv1.ThreadEntry
		for {
			es, err := late.Next(ctx)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			rest = append(rest, es...)
		}
		if describeAll(rest) != "text:live|done:q|outcome:ENDING_DONE" {
			t.Fatalf("late subscriber, live part: %s", describeAll(rest))
		}
	})
}

// failingStore fails every write while failing is set.
type failingStore struct {
	store.Store
	failing atomic.Bool
}

func (f *failingStore) Put(ctx context.Context, table string, it store.Item, conds ...store.Condition) (store.Item, error) {
	if f.failing.Load() {
		return store.Item{}, errors.New("store down")
	}
	return f.Store.Put(ctx, table, it, conds...)
}

func TestEndIsShownOnlyOnceStored(t *testing.T) {
	eachStore(t, func(t *testing.T, st *countingStore) {
		fs := &failingStore{Store: st}
		h := history.New(fs, history.Options{})
		ctx := context.Background()
		if err := h.Join(ctx, "th-fail", "client-a", "agent-1"); err != nil {
			t.Fatal(err)
		}
		rec, err := h.Begin(history.Exchange{ThreadID: "th-fail", RequestID: "gw.fail", AgentID: "agent-1", ClientID: "client-a", Content: "q"})
		if err != nil {
			t.Fatal(err)
		}
		sub := rec.Subscribe(1)
		if _, err := rec.Append(ctx, text("a"), false); err != nil {
			t.Fatal(err)
		}
		if err := rec.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		fs.failing.Store(true)
		endCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		if _, err := rec.End(endCtx, done("q"), doneOutcome); err == nil {
			t.Fatal("End succeeded on a failing store")
		}
		var got []*gatewayv1.ThreadEntry
		for {
			es, err := sub.Next(ctx)
			if err != nil {
				if errors.Is(err, io.EOF) {
					t.Fatal("the subscriber was told the request ended well")
				}
				break
			}
			got = append(got, es...)
		}
		if describeAll(got) != "text:a" {
			t.Fatalf("the subscriber saw %s before the error; the end was never stored", describeAll(got))
		}
	})
}

func TestNothingIsShownBeforeTheMessageIsStored(t *testing.T) {
	eachStore(t, func(t *testing.T, st *countingStore) {
		fs := &failingStore{Store: st}
		h := history.New(fs, history.Options{})
		ctx := context.Background()
		for _, tc := range []struct {
			name      string
			recovers  bool // the store comes back before the end
			wantShown string
		}{
			{"the store comes back", true, "message:q|text:a|text:b|done:q|outcome:ENDING_DONE"},
			{"the store stays down", false, ""},
		} {
			t.Run(tc.name, func(t *testing.T) {
				thread := "th-held-" + fmt.Sprint(tc.recovers)
				fs.failing.Store(false)
				if err := h.Join(ctx, thread, "client-a", "agent-1"); err != nil {
					t.Fatal(err)
				}
				fs.failing.Store(true)
				rec, err := h.Begin(history.Exchange{ThreadID: thread, RequestID: "gw.held", AgentID: "agent-1", ClientID: "client-a", Content: "q"})
				if err != nil {
					t.Fatal(err)
				}
				sub := rec.Subscribe(0)
				defer sub.Close()
				if _, err := rec.Append(ctx, text("a"), false); err != nil {
					t.Fatal(err)
				}
				if err := rec.Flush(ctx); err == nil || rec.Stored() {
					t.Fatalf("the first write succeeded on a failing store: %v", err)
				}
				// Nothing is shown while the message is not stored.
				waitCtx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
				got, err := sub.Next(waitCtx)
				cancel()
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("before the message is stored, a subscriber got %s, %v; want to wait for it", describeAll(got), err)
				}
				if _, err := rec.Append(ctx, text("b"), false); err != nil {
					t.Fatal(err)
				}
				fs.failing.Store(!tc.recovers)
				endCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
				defer cancel()
				if _, err := rec.End(endCtx, done("q"), doneOutcome); (err == nil) != tc.recovers {
					t.Fatalf("End: %v", err)
				}
				var shown []*gatewayv1.ThreadEntry
				for {
					es, err := sub.Next(ctx)
					if errors.Is(err, io.EOF) {
						break
					}
					if err != nil {
						if tc.recovers {
							t.Fatal(err)
						}
						break
					}
					shown = append(shown, es...)
				}
				if describeAll(shown) != tc.wantShown {
					t.Fatalf("shown %q, want %q", describeAll(shown), tc.wantShown)
				}
				fs.failing.Store(false)
				stored, _, err := h.Entries(ctx, thread, "", 100)
				if err != nil || describeAll(stored) != tc.wantShown {
					t.Fatalf("stored %q (%v), want %q", describeAll(stored), err, tc.wantShown)
				}
			})
		}
	})
}

func TestThreadsBelongToTheirClient(t *testing.T) {
	eachStore(t, func(t *testing.T, st *countingStore) {
		h := history.New(st, history.Options{TTL: time.Hour})
		ctx := context.Background()
		if err := h.Join(ctx, "shared-name", "client-a", "agent-1"); err != nil {
			t.Fatal(err)
		}
		before := st.writes.Load()
		if err := h.Join(ctx, "shared-name", "client-a", "agent-1"); err != nil {
			t.Fatal(err)
		}
		if n := st.writes.Load() - before; n != 0 {
			t.Fatalf("a known thread cost %d writes", n)
		}
		if err := h.Join(ctx, "shared-name", "client-b", "agent-1"); !errors.Is(err, history.ErrNotOwner) {
			t.Fatalf("another client's message: %v", err)
		}
		// Another replica, with nothing cached, refuses it too.
		other := history.New(st, history.Options{TTL: time.Hour})
		if err := other.Join(ctx, "shared-name", "client-b", "agent-2"); !errors.Is(err, history.ErrNotOwner) {
			t.Fatalf("another client's message, on another replica: %v", err)
		}
		if err := other.Join(ctx, "shared-name", "client-a", "agent-2"); err != nil {
			t.Fatal(err)
		}
		info, err := other.Thread(ctx, "shared-name")
		if err != nil || info.Owner != "client-a" || info.Agent != "agent-1" {
			t.Fatalf("thread: %+v %v", info, err)
		}
		if _, err := other.Thread(ctx, "never-written"); !errors.Is(err, history.ErrNotFound) {
			t.Fatalf("unknown thread: %v", err)
		}
		for _, agent := range []string{"agent-1", "agent-2"} {
			ths, next, err := other.Threads(ctx, agent, "", 10, "")
			if err != nil || next != "" || len(ths) != 1 || ths[0].ID != "shared-name" || ths[0].Owner != "client-a" {
				t.Fatalf("%s's threads: %+v %q %v", agent, ths, next, err)
			}
		}
	})
}

func TestThreadsNewestFirstPerClient(t *testing.T) {
	eachStore(t, func(t *testing.T, st *countingStore) {
		h := history.New(st, history.Options{})
		ctx := context.Background()
		var mine []string
		for i := range 12 {
			client := "client-a"
			if i%3 == 0 {
				client = "client-b"
			}
			id := fmt.Sprintf("th-%02d", i)
			if err := h.Join(ctx, id, client, "agent-1"); err != nil {
				t.Fatal(err)
			}
			if client == "client-a" {
				mine = append([]string{id}, mine...)
			}
			time.Sleep(2 * time.Millisecond) // distinct start times
		}
		list := func(client string, size int) []string {
			var got []string
			token := ""
			for {
				ths, next, err := h.Threads(ctx, "agent-1", client, size, token)
				if err != nil {
					t.Fatal(err)
				}
				if len(ths) > size {
					t.Fatalf("page of %d, asked %d", len(ths), size)
				}
				for _, th := range ths {
					got = append(got, th.ID)
				}
				if next == "" {
					return got
				}
				token = next
			}
		}
		for _, size := range []int{1, 3, 100} {
			if got := list("client-a", size); strings.Join(got, ",") != strings.Join(mine, ",") {
				t.Fatalf("client-a's threads in pages of %d: %v, want %v", size, got, mine)
			}
			if got := list("", size); len(got) != 12 || got[0] != "th-11" || got[11] != "th-00" {
				t.Fatalf("every thread in pages of %d: %v", size, got)
			}
		}
		if _, _, err := h.Threads(ctx, "agent-1", "", 5, "zz"); !errors.Is(err, history.ErrBadCursor) {
			t.Fatalf("a malformed token: %v", err)
		}
	})
}

func TestRetention(t *testing.T) {
	eachStore(t, func(t *testing.T, st *countingStore) {
		ctx := context.Background()
		const ttl = 24 * time.Hour
		// Written two TTLs ago: expired by now, whatever the backend.
		past := history.New(st, history.Options{TTL: ttl, Now: func() time.Time { return time.Now().Add(-2 * ttl) }})
		exchange(t, past, "th-old", "gw.old", "old question", "old answer")
		if es, _, err := past.Entries(ctx, "th-old", "", 10); err != nil || len(es) != 0 {
			t.Fatalf("expired entries are still read: %s %v", describeAll(es), err)
		}
		if _, err := past.Thread(ctx, "th-old"); !errors.Is(err, history.ErrNotFound) {
			t.Fatalf("an expired thread: %v", err)
		}
		if ths, _, err := past.Threads(ctx, "agent-1", "", 10, ""); err != nil || len(ths) != 0 {
			t.Fatalf("an expired thread is listed: %v %v", ths, err)
		}
		// Written now: kept, and marked to expire after the TTL.
		now := history.New(st, history.Options{TTL: ttl})
		exchange(t, now, "th-new", "gw.new", "new question", "new answer")
		page, err := st.Query(ctx, history.Table.Name, store.Query{PK: "t/th-new"})
		if err != nil || len(page.Items) == 0 {
			t.Fatalf("items: %v %v", page.Items, err)
		}
		for _, it := range page.Items {
			if left := time.Until(it.ExpiresAt); left <= ttl-time.Minute || left > ttl {
				t.Fatalf("item %s expires in %s, want about %s", it.SK, left, ttl)
			}
		}
		// Without a TTL nothing expires.
		forever := history.New(st, history.Options{})
		exchange(t, forever, "th-forever", "gw.forever", "q")
		page, _ = st.Query(ctx, history.Table.Name, store.Query{PK: "t/th-forever"})
		for _, it := range page.Items {
			if !it.ExpiresAt.IsZero() {
				t.Fatalf("item %s expires without a TTL", it.SK)
			}
		}
		// The embedded store's sweep deletes the expired items.
		if b, ok := st.Store.(*store.Bolt); ok {
			n, err := b.Sweep()
			if err != nil || n < 3 {
				t.Fatalf("sweep deleted %d items, %v", n, err)
			}
		}
	})
}

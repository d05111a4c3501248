package acp

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	sdk "github.com/coder/acp-go-sdk"

	"github.com/conclave-ai/conclave/pkg/jsonrpc"
	"github.com/conclave-ai/conclave/pkg/testenv"
)

// fsClient is a client whose fs handlers are confined to workspace; the
// tests call the handlers directly.
func fsClient(t testing.TB, workspace string, maxLine int) *Client {
	c := New(strings.NewReader(""), nopWriteCloser{io.Discard}, Options{Workspace: workspace, MaxLine: maxLine})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

type fsHandler func(context.Context, *jsonrpc.Request) (any, error)

// callFS runs an fs handler in a goroutine and waits for its answer until
// shortly before the test's own deadline, so that a handler that blocks
// (the defect this guards against) fails the test with a message rather
// than hanging the test binary.
func callFS(t *testing.T, h fsHandler, params any) (any, error) {
	t.Helper()
	raw, err := json.Marshal(params)
	if err != nil {
		t.Fatal(err)
	}
	type answer struct {
		res any
		err error
	}
	done := make(chan answer, 1)
	go func() {
		res, err := h(context.Background(), &jsonrpc.Request{ID: jsonrpc.Int64ID(1), Method: "fs", Params: raw})
		done <- answer{res, err}
	}()
	var expired <-chan time.Time
	if deadline, ok := t.Deadline(); ok {
		timer := time.NewTimer(time.Until(deadline) * 9 / 10)
		defer timer.Stop()
		expired = timer.C
	}
	select {
	case a := <-done:
		return a.res, a.err
	case <-expired:
		t.Fatalf("the handler did not answer %s before the test's deadline", raw)
		return nil, nil
	}
}

func mkfifo(t *testing.T, path string) {
	t.Helper()
	if err := syscall.Mkfifo(path, 0o644); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestFSRefusals: every path the fs methods must not serve is answered
// promptly with InvalidParams naming the problem, and nothing outside the
// workspace changes.
func TestFSRefusals(t *testing.T) {
	t.Parallel()
	ws, outside := t.TempDir(), t.TempDir()
	secret := filepath.Join(outside, "secret")
	writeFile(t, secret, "secret")
	mkfifo(t, filepath.Join(ws, "fifo"))
	// A FIFO that has a reader: opening it for writing succeeds, and the
	// old code wrote into the pipe.
	mkfifo(t, filepath.Join(ws, "fifo-read"))
	reader, err := os.OpenFile(filepath.Join(ws, "fifo-read"), os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reader.Close() })
	sock, err := net.Listen("unix", filepath.Join(ws, "sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sock.Close() })
	if err := os.Mkdir(filepath.Join(ws, "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{"link": secret, "out": outside, "dangling": filepath.Join(outside, "missing")} {
		if err := os.Symlink(target, filepath.Join(ws, name)); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(ws, "big"), strings.Repeat("x", 2048))

	c := fsClient(t, ws, 1024)
	// /dev as a workspace: its devices are inside, and still refused.
	dev := fsClient(t, "/dev", 1024)
	for _, tt := range []struct {
		name  string
		c     *Client
		write bool
		path  string
		want  string
	}{
		{"read a FIFO", c, false, filepath.Join(ws, "fifo"), "FIFO"},
		{"write a FIFO", c, true, filepath.Join(ws, "fifo"), "FIFO"},
		{"write a FIFO with a reader", c, true, filepath.Join(ws, "fifo-read"), "FIFO"},
		{"read a socket", c, false, filepath.Join(ws, "sock"), "socket"},
		{"write a socket", c, true, filepath.Join(ws, "sock"), "socket"},
		{"read a device", dev, false, "/dev/null", "device"},
		{"write a device", dev, true, "/dev/null", "device"},
		{"read a directory", c, false, filepath.Join(ws, "dir"), "directory"},
		{"write a directory", c, true, filepath.Join(ws, "dir"), "directory"},
		{"read the workspace itself", c, false, ws, "directory"},
		{"read a link out", c, false, filepath.Join(ws, "link"), "escapes"},
		{"write a link out", c, true, filepath.Join(ws, "link"), "escapes"},
		{"read through a linked directory out", c, false, filepath.Join(ws, "out", "secret"), "escapes"},
		{"write through a linked directory out", c, true, filepath.Join(ws, "out", "secret"), "escapes"},
		{"write a dangling link out", c, true, filepath.Join(ws, "dangling"), "escapes"},
		{"read with ..", c, false, filepath.Join(ws, "..", filepath.Base(outside), "secret"), "outside the workspace"},
		{"write outside", c, true, secret, "outside the workspace"},
		{"a relative path", c, false, "big", "absolute"},
		{"a missing file", c, false, filepath.Join(ws, "missing"), "no such file"},
		{"a file over the line limit", c, false, filepath.Join(ws, "big"), "over the 1024 byte limit"},
		{"no workspace", fsClient(t, "", 1024), false, filepath.Join(ws, "big"), "no workspace"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var (
				res any
				err error
			)
			if tt.write {
				res, err = callFS(t, tt.c.handleWriteFile, sdk.WriteTextFileRequest{Path: tt.path, Content: "overwritten"})
			} else {
				res, err = callFS(t, tt.c.handleReadFile, sdk.ReadTextFileRequest{Path: tt.path})
			}
			var rpcErr *jsonrpc.Error
			if !errors.As(err, &rpcErr) || rpcErr.Code != jsonrpc.InvalidParams || !strings.Contains(rpcErr.Message, tt.want) || !strings.Contains(rpcErr.Message, tt.path) {
				t.Fatalf("got %v, %v; want InvalidParams naming %s and mentioning %q", res, err, tt.path, tt.want)
			}
		})
	}
	t.Cleanup(func() {
		if data, err := os.ReadFile(secret); err != nil || string(data) != "secret" {
			t.Errorf("the file outside the workspace is now %q, %v", data, err)
		}
		if _, err := os.Lstat(filepath.Join(outside, "missing")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a write through a dangling link created its target outside: %v", err)
		}
	})
}

// TestFSReadWrite: good paths keep working, line and limit select lines,
// a shorter write truncates, a file exactly at the limit is served, and a
// workspace given through a link is reachable by either of its paths.
func TestFSReadWrite(t *testing.T) {
	t.Parallel()
	real := t.TempDir()
	ws := filepath.Join(t.TempDir(), "ws")
	if err := os.Symlink(real, ws); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(real, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("sub", filepath.Join(real, "inner")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(real, "exact"), strings.Repeat("y", 64))
	c := fsClient(t, ws, 64)

	write := func(path, content string) {
		t.Helper()
		if _, err := callFS(t, c.handleWriteFile, sdk.WriteTextFileRequest{Path: path, Content: content}); err != nil {
			t.Fatalf("write %s: %v", path, err)
		}
	}
	read := func(p sdk.ReadTextFileRequest) string {
		t.Helper()
		res, err := callFS(t, c.handleReadFile, p)
		if err != nil {
			t.Fatalf("read %+v: %v", p, err)
		}
		return testenv.As[sdk.ReadTextFileResponse](t, res, "the read's answer").Content
	}
	one, two := 1, 2
	write(filepath.Join(ws, "a.txt"), "first line that is long\nsecond\nthird\nfourth\n")
	if got := read(sdk.ReadTextFileRequest{Path: filepath.Join(ws, "a.txt"), Line: &two, Limit: &two}); got != "second\nthird\n" {
		t.Errorf("line 2, limit 2: %q", got)
	}
	if got := read(sdk.ReadTextFileRequest{Path: filepath.Join(real, "a.txt"), Limit: &one}); got != "first line that is long\n" {
		t.Errorf("by the real path, limit 1: %q", got)
	}
	write(filepath.Join(real, "a.txt"), "short")
	if got := read(sdk.ReadTextFileRequest{Path: filepath.Join(ws, "a.txt")}); got != "short" {
		t.Errorf("after a shorter write: %q", got)
	}
	write(filepath.Join(ws, "inner", "b.txt"), "through a link inside")
	if data, err := os.ReadFile(filepath.Join(real, "sub", "b.txt")); err != nil || string(data) != "through a link inside" {
		t.Errorf("write through a link inside: %q, %v", data, err)
	}
	if got := read(sdk.ReadTextFileRequest{Path: filepath.Join(ws, "exact")}); len(got) != 64 {
		t.Errorf("a file at the limit: %d bytes", len(got))
	}
}

// TestFSLinkSwap races the fs methods against a directory of the
// workspace being swapped, again and again, for a link out of it: a check
// of the path followed by an open by name could be fooled; opening through
// os.Root cannot.
func TestFSLinkSwap(t *testing.T) {
	t.Parallel()
	ws, outside := t.TempDir(), t.TempDir()
	dir, away := filepath.Join(ws, "d"), filepath.Join(ws, "d.away")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "f"), "inside")
	writeFile(t, filepath.Join(outside, "f"), "secret")
	stop := make(chan struct{})
	swapped := make(chan struct{})
	go func() {
		defer close(swapped)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if os.Rename(dir, away) == nil {
				_ = os.Symlink(outside, dir)
				_ = os.Remove(dir)
				_ = os.Rename(away, dir)
			}
		}
	}()
	c := fsClient(t, ws, 1024)
	path := filepath.Join(dir, "f")
	for range 2000 {
		res, err := callFS(t, c.handleReadFile, sdk.ReadTextFileRequest{Path: path})
		if err != nil {
			continue
		}
		if got := testenv.As[sdk.ReadTextFileResponse](t, res, "the read's answer").Content; got != "inside" {
			t.Errorf("read %q from outside the workspace", got)
			break
		}
		_, _ = callFS(t, c.handleWriteFile, sdk.WriteTextFileRequest{Path: path, Content: "inside"})
	}
	close(stop)
	<-swapped
	if data, err := os.ReadFile(filepath.Join(outside, "f")); err != nil || string(data) != "secret" {
		t.Errorf("the file outside the workspace is now %q, %v", data, err)
	}
}

// FuzzWorkspacePath: whatever path an agent sends, the fs methods answer
// without panicking, a path accepted as relative stays local, and nothing
// outside the workspace is read, through links included.
func FuzzWorkspacePath(f *testing.F) {
	ws, outside := f.TempDir(), f.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o644); err != nil {
		f.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "a"), []byte("a"), 0o644); err != nil {
		f.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(ws, "out")); err != nil {
		f.Fatal(err)
	}
	c := New(strings.NewReader(""), nopWriteCloser{io.Discard}, Options{Workspace: ws, MaxLine: 1024})
	f.Cleanup(func() { _ = c.Close() })
	for _, seed := range []string{
		"a", "/a", ws + "/a", ws + "/out/secret", ws + "/../" + filepath.Base(outside) + "/secret",
		ws + "/./a", ws + "//a", ws, ws + "/", ws + "/out/../a", ws + "/a\x00", "", ws + "/out/../../x",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, path string) {
		if rel, err := workspaceRelative(ws, path); err == nil && !filepath.IsLocal(rel) {
			t.Fatalf("workspaceRelative(%q) = %q, not local", path, rel)
		}
		raw, _ := json.Marshal(sdk.ReadTextFileRequest{Path: path})
		res, err := c.handleReadFile(context.Background(), &jsonrpc.Request{ID: jsonrpc.Int64ID(1), Method: "fs/read_text_file", Params: raw})
		if err == nil && strings.Contains(testenv.As[sdk.ReadTextFileResponse](t, res, "the read's answer").Content, "secret") {
			t.Fatalf("read %q outside the workspace", path)
		}
	})
}

package testenv_test

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

func TestWriteImage(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	hostFile := filepath.Join(dir, "tool")
	if err := os.WriteFile(hostFile, []byte("tool-bytes"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "img.tar")
	err := testenv.WriteImage(path, testenv.Image{
		Ref: "local/thing:2",
		Files: []testenv.ImageFile{
			{Path: "/usr/local/bin/tool", HostPath: hostFile},
			{Path: "/etc/conf", Data: []byte("a=b\n"), Mode: 0o644},
		},
		Entrypoint: []string{"/usr/local/bin/tool"},
		Cmd:        []string{"serve"},
		Env:        []string{"MODE=test"},
		WorkingDir: "/tmp",
		User:       "65532:65532",
	})
	if err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag("local/thing:2")
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(path, &tag)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" {
		t.Errorf("platform %s/%s", cf.OS, cf.Architecture)
	}
	if !slices.Equal(cf.Config.Entrypoint, []string{"/usr/local/bin/tool"}) || !slices.Equal(cf.Config.Cmd, []string{"serve"}) || cf.Config.WorkingDir != "/tmp" || cf.Config.User != "65532:65532" {
		t.Errorf("config %+v", cf.Config)
	}
	if !slices.Contains(cf.Config.Env, "MODE=test") || !slices.Contains(cf.Config.Env, "PATH=/bin:/usr/bin:/sbin:/usr/sbin") {
		t.Errorf("env %q", cf.Config.Env)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers %d, %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	got := map[string]string{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		got[h.Name] = string(b) + " " + strconv.FormatInt(h.Mode, 8)
	}
	for entry, want := range map[string]string{
		"usr/local/bin/tool": "tool-bytes 755",
		"etc/conf":           "a=b\n 644",
		"usr/":               " 755",
		"usr/local/bin/":     " 755",
		"tmp/":               " 1777",
		"proc/":              " 755",
	} {
		if got[entry] != want {
			t.Errorf("layer entry %s = %q, want %q", entry, got[entry], want)
		}
	}
}

func TestWriteImageRejects(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		img  testenv.Image
	}{
		{"bad ref", testenv.Image{Ref: "UPPER/case:x y"}},
		{"relative path", testenv.Image{Ref: "local/x:1", Files: []testenv.ImageFile{{Path: "bin/x", Data: []byte("x")}}}},
		{"root path", testenv.Image{Ref: "local/x:1", Files: []testenv.ImageFile{{Path: "/", Data: []byte("x")}}}},
		{"no content", testenv.Image{Ref: "local/x:1", Files: []testenv.ImageFile{{Path: "/x"}}}},
		{"missing host file", testenv.Image{Ref: "local/x:1", Files: []testenv.ImageFile{{Path: "/x", HostPath: "/nonexistent/file"}}}},
		{"file over a directory", testenv.Image{Ref: "local/x:1", Files: []testenv.ImageFile{{Path: "/a/b", Data: []byte("x")}, {Path: "/a", Data: []byte("y")}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if err := testenv.WriteImage(filepath.Join(t.TempDir(), "img.tar"), tc.img); err == nil {
				t.Fatal("no error")
			}
		})
	}
}

package testenv

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// ImageFile is one file of an image built by WriteImage.
type ImageFile struct {
	// Path is where the file is in the image, absolute ("/bin/agent").
	Path string
	// Data is its content; when nil, HostPath's content is used.
	Data []byte
	// HostPath is a file on this machine to copy into the image.
	HostPath string
	// Mode is its permission bits; zero means 0o755.
	Mode fs.FileMode
}

// Image describes a one-layer container image built offline, without a
// registry or a container daemon.
type Image struct {
	// Ref names the image, e.g. "local/agent-host:1". Imported into a
	// KubeNode it is known as the normalised "docker.io/local/agent-host:1";
	// pods may use either form with imagePullPolicy: Never.
	Ref        string
	Files      []ImageFile
	Entrypoint []string
	Cmd        []string
	// Env holds NAME=value pairs. When it sets no PATH, PATH is
	// /bin:/usr/bin:/sbin:/usr/sbin.
	Env        []string
	WorkingDir string
	// User is the image's USER, e.g. "65532:65532" (numeric, for pods
	// that must run as non-root); empty is root.
	User string
}

// imageDirs exist in every image: the runtime mounts proc, sys and dev
// there, and programs expect a writable /tmp.
var imageDirs = []string{"/dev", "/etc", "/proc", "/sys", "/tmp", "/var"}

// WriteImage writes img as a docker-save tarball (the format `ctr images
// import` and KubeNode.ImportImage read) to path.
func WriteImage(path string, img Image) error {
	ref, err := name.ParseReference(img.Ref)
	if err != nil {
		return fmt.Errorf("testenv: image ref %q: %w", img.Ref, err)
	}
	layerTar, err := imageLayer(img.Files)
	if err != nil {
		return fmt.Errorf("testenv: image %s: %w", img.Ref, err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return err
	}
	v1img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cf, err := v1img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Entrypoint = img.Entrypoint
	cf.Config.Cmd = img.Cmd
	cf.Config.WorkingDir = img.WorkingDir
	cf.Config.User = img.User
	cf.Config.Env = img.Env
	if !hasEnv(img.Env, "PATH") {
		cf.Config.Env = append([]string{"PATH=/bin:/usr/bin:/sbin:/usr/sbin"}, img.Env...)
	}
	v1img, err = mutate.ConfigFile(v1img, cf)
	if err != nil {
		return err
	}
	if err := tarball.WriteToFile(path, ref, v1img); err != nil {
		return fmt.Errorf("testenv: write image %s: %w", img.Ref, err)
	}
	return nil
}

func hasEnv(env []string, key string) bool {
	for _, kv := range env {
		if strings.HasPrefix(kv, key+"=") {
			return true
		}
	}
	return false
}

// imageLayer builds the layer's tar: the standard directories, each file's
// parent directories, then the files, in a stable order.
func imageLayer(files []ImageFile) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	// A fixed time keeps the layer's digest the same from build to build.
	mtime := time.Unix(0, 0)
	dirs := map[string]bool{"/": true}
	written := map[string]bool{}
	mkdirs := func(p string) error {
		var parents []string
		for d := p; !dirs[d]; d = path.Dir(d) {
			if written[d] {
				return fmt.Errorf("%s is a file and a directory", d)
			}
			parents = append(parents, d)
		}
		for i := len(parents) - 1; i >= 0; i-- {
			d := parents[i]
			dirs[d] = true
			mode := int64(0o755)
			if d == "/tmp" {
				mode = 0o1777
			}
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/", Mode: mode, ModTime: mtime}); err != nil {
				return err
			}
		}
		return nil
	}
	for _, d := range imageDirs {
		if err := mkdirs(d); err != nil {
			return nil, err
		}
	}
	sorted := append([]ImageFile(nil), files...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Path < sorted[j].Path })
	for _, f := range sorted {
		p := path.Clean(f.Path)
		if !path.IsAbs(p) || p == "/" {
			return nil, fmt.Errorf("file path %q is not an absolute file path", f.Path)
		}
		data := f.Data
		if data == nil {
			if f.HostPath == "" {
				return nil, fmt.Errorf("file %s has neither Data nor HostPath", p)
			}
			var err error
			if data, err = os.ReadFile(f.HostPath); err != nil {
				return nil, err
			}
		}
		mode := f.Mode.Perm()
		if mode == 0 {
			mode = 0o755
		}
		if err := mkdirs(path.Dir(p)); err != nil {
			return nil, err
		}
		if dirs[p] || written[p] {
			return nil, fmt.Errorf("%s is in the image twice", p)
		}
		written[p] = true
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(p, "/"), Mode: int64(mode), Size: int64(len(data)), ModTime: mtime}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// BuildStatic builds the Go main package pkg of this workspace (an import
// path, or a path relative to the repository root such as
// "./examples/acp-agent") into a static binary at out, so it runs in an
// image with nothing else in it (GoBuild).
func BuildStatic(ctx context.Context, pkg, out string) error {
	if err := GoBuild(ctx, out, pkg); err != nil {
		return err
	}
	if _, err := os.Stat(out); err != nil {
		return errors.Join(fmt.Errorf("testenv: go build %s wrote no binary", pkg), err)
	}
	return nil
}

// HostProgramFiles is a dynamically linked program of this machine and
// the shared libraries it loads (as ldd lists them, the loader included),
// each at its own path, for an image that runs it (a Python interpreter,
// say) without a distribution of its own underneath.
func HostProgramFiles(ctx context.Context, program string) ([]ImageFile, error) {
	out, err := exec.CommandContext(ctx, "ldd", program).Output()
	if err != nil {
		return nil, fmt.Errorf("testenv: ldd %s: %w", program, err)
	}
	files := []ImageFile{{Path: program, HostPath: program, Mode: 0o755}}
	for line := range strings.SplitSeq(string(out), "\n") {
		// "libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x...)" or
		// "/lib64/ld-linux-x86-64.so.2 (0x...)"; the vDSO has no path.
		fields := strings.Fields(line)
		var lib string
		switch {
		case len(fields) >= 3 && fields[1] == "=>":
			lib = fields[2]
		case len(fields) >= 1 && strings.HasPrefix(fields[0], "/"):
			lib = fields[0]
		}
		if lib != "" && filepath.IsAbs(lib) {
			files = append(files, ImageFile{Path: lib, HostPath: lib, Mode: 0o755})
		}
	}
	return files, nil
}

// HostTreeFiles is every regular file under dir on this machine (symbolic
// links followed), under at in an image ("" for dir's own path), but for
// the subdirectories and files whose path relative to dir skip reports.
func HostTreeFiles(dir, at string, skip func(rel string) bool) ([]ImageFile, error) {
	if at == "" {
		at = dir
	}
	var files []ImageFile
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		if rel != "." && skip != nil && skip(rel) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			return nil
		}
		info, err := os.Stat(p)
		if err != nil || !info.Mode().IsRegular() {
			return nil // a dangling link, a socket: nothing to run
		}
		files = append(files, ImageFile{Path: path.Join(filepath.ToSlash(at), filepath.ToSlash(rel)), HostPath: p, Mode: info.Mode().Perm()})
		return nil
	})
	return files, err
}

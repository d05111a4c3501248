// Package images builds Conclave's container images and the Librarian's
// Lambda zip offline: no registry, no Docker daemon, nothing fetched. An
// image is a base assembled here (the build machine's Debian CA bundle,
// /etc/passwd and /etc/group with root and nonroot, /tmp, /home/nonroot)
// plus one layer holding the deployable's binary, built by `go build` from
// the repository's go.work. The result is meant to be equivalent to the
// Dockerfiles' distroless images (docs/deploy.md says where they differ).
//
// Every timestamp comes from the caller (SOURCE_DATE_EPOCH), files are
// written in a fixed order with fixed owners, and Go builds are
// reproducible with -trimpath, so building the same commit twice gives the
// same image digest.
package images

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Image is one deployable's image.
type Image struct {
	// Name is the image's name: repository conclave/<Name>, tarball <Name>.tar.
	Name string
	// Binary is the executable's name, installed as /usr/local/bin/<Binary>.
	Binary string
	// Package is the main package, relative to the repository root.
	Package string
	// Ports are the TCP ports the deployable listens on by default.
	Ports []int
	// Dockerfile builds the same image with Docker, relative to the
	// repository root (which is its build context).
	Dockerfile string
}

// Images are the images `make images` builds. The ports are the defaults
// of each service's Config (the `default:":port"` of its listen addresses in
// services/<name>/service/service.go) and the Dockerfiles' EXPOSE lines; the
// test checks all three agree.
var Images = []Image{
	{Name: "gateway", Binary: "gateway", Package: "./services/gateway/cmd/gateway", Ports: []int{50051, 8080}, Dockerfile: "services/gateway/Dockerfile"},
	{Name: "bus", Binary: "bus", Package: "./services/bus/cmd/bus", Ports: []int{7892}, Dockerfile: "services/bus/Dockerfile"},
	{Name: "runner", Binary: "runner", Package: "./services/runner/cmd/runner", Ports: []int{50052, 8082}, Dockerfile: "services/runner/Dockerfile"},
	// The web console: its pages, stylesheet and script are embedded in
	// the binary.
	{Name: "console", Binary: "console", Package: "./services/console/cmd/console", Ports: []int{8090}, Dockerfile: "services/console/Dockerfile"},
	// The runner's Kubernetes executor copies agent-host from this image
	// into every agent's pod (its init container runs `agent-host
	// install`), where it runs the agent and dials back to the runner.
	{Name: "agent-host", Binary: "agent-host", Package: "./services/runner/cmd/agent-host", Dockerfile: "services/runner/Dockerfile.agent-host"},
	// The example ACP agent on stdio, an agent image for the Kubernetes
	// executor (an agent type's image, command /usr/local/bin/acp-agent).
	{Name: "acp-agent", Binary: "acp-agent", Package: "./examples/acp-agent", Dockerfile: "examples/acp-agent/Dockerfile"},
}

// Names are the images' names, in Images' order.
func Names() []string {
	names := make([]string, len(Images))
	for i, img := range Images {
		names[i] = img.Name
	}
	return names
}

// Lookup returns the image called name.
func Lookup(name string) (Image, bool) {
	i := slices.IndexFunc(Images, func(img Image) bool { return img.Name == name })
	if i < 0 {
		return Image{}, false
	}
	return Images[i], true
}

// The base's fixed contents.
const (
	// CACertsPath is where Debian's ca-certificates package installs the
	// bundle, and where the image holds it.
	CACertsPath = "/etc/ssl/certs/ca-certificates.crt"
	// NonrootUID is distroless's nonroot user and group.
	NonrootUID = 65532
	// BinDir holds the deployable's binary.
	BinDir = "/usr/local/bin"

	// Distroless's PATH.
	pathEnv = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

	passwd = "root:x:0:0:root:/root:/sbin/nologin\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
		"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	group = "root:x:0:\n" +
		"nobody:x:65534:\n" +
		"nonroot:x:65532:\n"
	// Go's resolver reads it to consult /etc/hosts before DNS.
	nsswitch = "hosts: files dns\n"
)

// Builder builds images from one repository checkout.
type Builder struct {
	// Root is the repository root, which holds go.work.
	Root string
	// Arch is the images' GOARCH: amd64 or arm64.
	Arch string
	// CACerts is the CA bundle copied into the base, normally CACertsPath.
	CACerts string
	// Created is every timestamp the images and the zip carry.
	Created time.Time
	// Source and Revision are the org.opencontainers.image.source and
	// .revision labels; an empty one is left out.
	Source, Revision string
	// Version is the images' tag and org.opencontainers.image.version.
	Version string
	// Log receives a line per step; nil discards them.
	Log io.Writer
}

func (b *Builder) logf(format string, args ...any) {
	if b.Log != nil {
		fmt.Fprintf(b.Log, format+"\n", args...)
	}
}

// Ref is the reference an image is tagged with in its tarball:
// conclave/<name>:<version>, what the Helm chart asks for with an empty
// image.registry and the chart's appVersion as tag.
func (b *Builder) Ref(img Image) (name.Tag, error) {
	return name.NewTag("conclave/" + img.Name + ":" + b.Version)
}

// Base assembles the base image: one layer with the CA bundle, the users and
// groups, /tmp and /home/nonroot, and no configuration yet.
func (b *Builder) Base() (v1.Image, error) {
	certs, err := os.ReadFile(b.CACerts)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("CA bundle %s is missing: install Debian's ca-certificates package (scripts/install-test-deps.sh does): %w", b.CACerts, err)
		}
		return nil, fmt.Errorf("read the CA bundle: %w", err)
	}
	if !bytes.Contains(certs, []byte("-----BEGIN CERTIFICATE-----")) {
		return nil, fmt.Errorf("CA bundle %s holds no PEM certificate: reinstall Debian's ca-certificates package", b.CACerts)
	}
	entries := []tarEntry{
		b.dir("etc/", 0o755, 0),
		b.file("etc/group", 0o644, 0, []byte(group)),
		b.file("etc/nsswitch.conf", 0o644, 0, []byte(nsswitch)),
		b.file("etc/passwd", 0o644, 0, []byte(passwd)),
		b.dir("etc/ssl/", 0o755, 0),
		b.dir("etc/ssl/certs/", 0o755, 0),
		b.file(strings.TrimPrefix(CACertsPath, "/"), 0o644, 0, certs),
		b.dir("home/", 0o755, 0),
		b.dir("home/nonroot/", 0o700, NonrootUID),
		b.dir("root/", 0o700, 0),
		b.dir("tmp/", 0o1777, 0),
	}
	layer, err := tarLayer(entries)
	if err != nil {
		return nil, fmt.Errorf("base layer: %w", err)
	}
	return mutate.Append(empty.Image, mutate.Addendum{
		Layer: layer,
		History: v1.History{
			Created:   v1.Time{Time: b.Created},
			CreatedBy: "conclave-images: base (" + CACertsPath + " from Debian's ca-certificates, /etc/passwd, /etc/group, /tmp, /home/nonroot)",
		},
	})
}

// Build builds img's binary for b.Arch into workDir and returns base with a
// layer holding it and the image's configuration.
func (b *Builder) Build(ctx context.Context, base v1.Image, img Image, workDir string) (v1.Image, error) {
	bin := filepath.Join(workDir, img.Binary)
	b.logf("images: go build %s (linux/%s)", img.Package, b.Arch)
	if err := b.goBuild(ctx, img.Package, bin, b.Arch, nil, ""); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	binPath := BinDir + "/" + img.Binary
	layer, err := tarLayer([]tarEntry{
		b.dir("usr/", 0o755, 0),
		b.dir("usr/local/", 0o755, 0),
		b.dir("usr/local/bin/", 0o755, 0),
		b.file(strings.TrimPrefix(binPath, "/"), 0o755, 0, data),
	})
	if err != nil {
		return nil, fmt.Errorf("%s layer: %w", img.Name, err)
	}
	out, err := mutate.Append(base, mutate.Addendum{
		Layer: layer,
		History: v1.History{
			Created:   v1.Time{Time: b.Created},
			CreatedBy: "conclave-images: go build -trimpath " + img.Package + " (CGO_ENABLED=0 GOOS=linux GOARCH=" + b.Arch + ") as " + binPath,
		},
	})
	if err != nil {
		return nil, err
	}
	cf, err := out.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = b.Arch
	cf.Created = v1.Time{Time: b.Created}
	cf.Config.User = strconv.Itoa(NonrootUID) + ":" + strconv.Itoa(NonrootUID)
	cf.Config.Entrypoint = []string{binPath}
	cf.Config.WorkingDir = "/"
	cf.Config.Env = []string{pathEnv, "SSL_CERT_FILE=" + CACertsPath}
	cf.Config.Labels = map[string]string{
		"org.opencontainers.image.title":   "conclave/" + img.Name,
		"org.opencontainers.image.version": b.Version,
	}
	if b.Source != "" {
		cf.Config.Labels["org.opencontainers.image.source"] = b.Source
	}
	if b.Revision != "" {
		cf.Config.Labels["org.opencontainers.image.revision"] = b.Revision
	}
	if len(img.Ports) > 0 {
		cf.Config.ExposedPorts = map[string]struct{}{}
		for _, p := range img.Ports {
			cf.Config.ExposedPorts[strconv.Itoa(p)+"/tcp"] = struct{}{}
		}
	}
	return mutate.ConfigFile(out, cf)
}

// WriteTarball writes image as a `docker save` tarball tagged ref, which
// `docker load`, `ctr images import` and `kind load image-archive` read. It
// writes to a temporary file first, so path never holds half an image.
func WriteTarball(path string, ref name.Tag, image v1.Image) error {
	tmp := path + ".tmp"
	if err := tarball.WriteToFile(tmp, ref, image); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return os.Rename(tmp, path)
}

// LibrarianPackage is the Librarian's main package.
const LibrarianPackage = "./functions/librarian"

// BuildLibrarianZip builds the Librarian for Lambda's provided.al2023
// runtime on arm64 (static, -tags lambda.norpc, as docs/infra.md says) and
// writes it to path as a zip holding one executable file, bootstrap.
func (b *Builder) BuildLibrarianZip(ctx context.Context, path, workDir string) error {
	bin := filepath.Join(workDir, "bootstrap")
	b.logf("images: go build %s (linux/arm64, lambda.norpc)", LibrarianPackage)
	if err := b.goBuild(ctx, LibrarianPackage, bin, "arm64", []string{"lambda.norpc"}, "-s -w"); err != nil {
		return err
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	h := &zip.FileHeader{Name: "bootstrap", Method: zip.Deflate, Modified: zipTime(b.Created)}
	h.SetMode(0o755)
	w, err := zw.CreateHeader(h)
	if err != nil {
		return err
	}
	if _, err := w.Write(data); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, buf.Bytes(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// zipTime is t, or 1980-01-01 when t is earlier: a zip's MS-DOS timestamps
// start in 1980, and SOURCE_DATE_EPOCH's default is 1970.
func zipTime(t time.Time) time.Time {
	if floor := time.Date(1980, 1, 1, 0, 0, 0, 0, time.UTC); t.Before(floor) {
		return floor
	}
	return t.UTC()
}

// goBuild builds pkg for linux/goarch into out, statically and without the
// build machine's paths, with the repository's go.work whatever the caller's
// GOWORK (this module's tests run with GOWORK=off).
func (b *Builder) goBuild(ctx context.Context, pkg, out, goarch string, tags []string, ldflags string) error {
	args := []string{"build", "-trimpath", "-buildvcs=false", "-o", out}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	if ldflags != "" {
		args = append(args, "-ldflags", ldflags)
	}
	args = append(args, pkg)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = b.Root
	cmd.Env = append(os.Environ(),
		"GOWORK="+filepath.Join(b.Root, "go.work"),
		"CGO_ENABLED=0", "GOOS=linux", "GOARCH="+goarch)
	var output bytes.Buffer
	cmd.Stdout = &output
	cmd.Stderr = &output
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s for linux/%s: %w\n%s", pkg, goarch, err, output.Bytes())
	}
	return checkELF(out, goarch)
}

// checkELF verifies that path is a static-looking ELF executable for goarch,
// so a wrong GOARCH in the environment cannot slip into an image.
func checkELF(path, goarch string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s is not an ELF executable: %w", path, err)
	}
	defer f.Close()
	want := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[goarch]
	if f.Machine != want {
		return fmt.Errorf("%s is built for %s, want %s (%s)", path, f.Machine, want, goarch)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked (CGO_ENABLED=0 was not honoured)", path)
		}
	}
	return nil
}

// tarEntry is one file or directory of a layer.
type tarEntry struct {
	header tar.Header
	body   []byte
}

func (b *Builder) dir(name string, mode int64, owner int) tarEntry {
	return tarEntry{header: b.header(name, tar.TypeDir, mode, owner, 0)}
}

func (b *Builder) file(name string, mode int64, owner int, body []byte) tarEntry {
	return tarEntry{header: b.header(name, tar.TypeReg, mode, owner, int64(len(body))), body: body}
}

func (b *Builder) header(name string, typ byte, mode int64, owner int, size int64) tar.Header {
	user := "root"
	if owner == NonrootUID {
		user = "nonroot"
	}
	return tar.Header{
		Typeflag: typ,
		Name:     name,
		Mode:     mode,
		Uid:      owner,
		Gid:      owner,
		Uname:    user,
		Gname:    user,
		Size:     size,
		ModTime:  b.Created.Truncate(time.Second),
	}
}

// tarLayer makes a gzip-compressed layer of entries, in their order. The
// compressed bytes are kept: the digest and the tarball both need them, and
// compressing a binary twice costs more than holding it.
func tarLayer(entries []tarEntry) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		if err := tw.WriteHeader(&e.header); err != nil {
			return nil, fmt.Errorf("%s: %w", e.header.Name, err)
		}
		if _, err := tw.Write(e.body); err != nil {
			return nil, fmt.Errorf("%s: %w", e.header.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithCompressedCaching)
}

// Revision is the repository's git HEAD, with "-dirty" when tracked files
// differ from it, or "" when git or the repository is not there.
func Revision(ctx context.Context, root string) string {
	head, err := exec.CommandContext(ctx, "git", "-C", root, "rev-parse", "HEAD").Output()
	if err != nil {
		return ""
	}
	rev := strings.TrimSpace(string(head))
	status, err := exec.CommandContext(ctx, "git", "-C", root, "status", "--porcelain", "--untracked-files=no").Output()
	if err == nil && len(bytes.TrimSpace(status)) > 0 {
		rev += "-dirty"
	}
	return rev
}

// SourceDateEpoch is $SOURCE_DATE_EPOCH (seconds since 1970, the
// reproducible-builds.org convention) or, when it is unset, 1970 itself.
func SourceDateEpoch() (time.Time, error) {
	v := os.Getenv("SOURCE_DATE_EPOCH")
	if v == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	secs, err := strconv.ParseInt(v, 10, 64)
	if err != nil || secs < 0 {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q: want a non-negative number of seconds since 1970", v)
	}
	return time.Unix(secs, 0).UTC(), nil
}

// ChartVersion is the appVersion of helm/conclave/Chart.yaml, the tag the
// chart asks for when none is set.
func ChartVersion(root string) (string, error) {
	path := filepath.Join(root, "helm", "conclave", "Chart.yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "appVersion:"); ok {
			if v = strings.Trim(strings.TrimSpace(v), `"'`); v != "" {
				return v, nil
			}
		}
	}
	return "", fmt.Errorf("%s has no appVersion", path)
}

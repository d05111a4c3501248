package images

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"debug/elf"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// repoRoot is the repository root, two directories above this module.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.work")); err != nil {
		t.Fatalf("repository root: %v", err)
	}
	return root
}

// testedImages are the images TestCommand builds: every image, the four
// deployables (which the chart's install test on a real node runs too) and
// the two the Kubernetes executor runs.
var testedImages = []string{"gateway", "bus", "runner", "console", "agent-host", "acp-agent"}

// testArch is the tested images' architecture, the machine's own, so that
// the test can run the binaries it unpacks from them.
var testArch = runtime.GOARCH

// runCommand builds conclave-images and runs it for testedImages and the
// Librarian's zip into a fresh directory, as `make images` does. The
// builds run outside the test binary, so -race does not slow compressing
// the binaries down.
func runCommand(t *testing.T, tool string) string {
	t.Helper()
	out := t.TempDir()
	args := append([]string{"-root", repoRoot(t), "-out", out, "-arch", testArch}, testedImages...)
	cmd := exec.CommandContext(t.Context(), tool, append(args, "librarian")...)
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH="+strconv.FormatInt(testEpoch.Unix(), 10))
	if output, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, output)
	}
	return out
}

// testEpoch is the SOURCE_DATE_EPOCH of the tests' builds.
var testEpoch = time.Unix(1700000000, 0).UTC()

// TestCommand builds testedImages and the Librarian's zip twice with
// conclave-images, checks both builds are identical byte for byte, and reads
// them back the way a container runtime and Lambda would.
func TestCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds every image and the Librarian with go build")
	}
	tool := filepath.Join(t.TempDir(), "conclave-images")
	build := exec.CommandContext(t.Context(), "go", "build", "-o", tool, "./cmd/conclave-images")
	if output, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build conclave-images: %v\n%s", err, output)
	}
	first, second := runCommand(t, tool), runCommand(t, tool)
	outputs := []string{"librarian.zip"}
	for _, name := range testedImages {
		outputs = append(outputs, name+".tar")
	}
	for _, name := range outputs {
		a, err := os.ReadFile(filepath.Join(first, name))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(second, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("two builds of one tree wrote different %s", name)
		}
	}
	for _, name := range testedImages {
		t.Run(name+" image", func(t *testing.T) {
			t.Parallel()
			img, ok := Lookup(name)
			if !ok {
				t.Fatalf("no image %s", name)
			}
			files := checkImage(t, img, filepath.Join(first, name+".tar"), filepath.Join(second, name+".tar"))
			if name == "agent-host" {
				checkAgentHostInstall(t, files["usr/local/bin/agent-host"].body)
			}
		})
	}
	t.Run("librarian zip", func(t *testing.T) {
		t.Parallel()
		checkLibrarianZip(t, filepath.Join(first, "librarian.zip"))
	})
}

// checkImage checks the image img built at path (and again at againPath):
// its tag, configuration and filesystem. It returns the filesystem.
func checkImage(t *testing.T, want Image, path, againPath string) map[string]layerFile {
	root := repoRoot(t)
	version, err := ChartVersion(root)
	if err != nil {
		t.Fatal(err)
	}
	revision := Revision(t.Context(), root)
	if revision == "" {
		t.Error("no git revision found for the label")
	}
	img, err := tarball.ImageFromPath(path, nil)
	if err != nil {
		t.Fatalf("load %s: %v", path, err)
	}
	again, err := tarball.ImageFromPath(againPath, nil)
	if err != nil {
		t.Fatalf("load %s: %v", againPath, err)
	}
	digest, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if againDigest, err := again.Digest(); err != nil || againDigest != digest {
		t.Errorf("two builds of one tree: digests %s and %s (%v)", digest, againDigest, err)
	}
	tag, err := name.NewTag("conclave/" + want.Name + ":" + version)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tarball.ImageFromPath(path, &tag); err != nil {
		t.Errorf("the tarball holds no %s: %v", tag, err)
	}

	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != testArch {
		t.Errorf("platform %s/%s, want linux/%s", cf.OS, cf.Architecture, testArch)
	}
	if !cf.Created.Equal(testEpoch) {
		t.Errorf("created %s, want SOURCE_DATE_EPOCH's %s", cf.Created, testEpoch)
	}
	c := cf.Config
	if c.User != "65532:65532" {
		t.Errorf("User %q, want 65532:65532", c.User)
	}
	binPath := "/usr/local/bin/" + want.Binary
	if !slices.Equal(c.Entrypoint, []string{binPath}) {
		t.Errorf("Entrypoint %q, want %s", c.Entrypoint, binPath)
	}
	if c.WorkingDir != "/" {
		t.Errorf("WorkingDir %q", c.WorkingDir)
	}
	if !slices.Contains(c.Env, "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt") || !slices.ContainsFunc(c.Env, func(e string) bool { return strings.HasPrefix(e, "PATH=") }) {
		t.Errorf("Env %q lacks PATH or SSL_CERT_FILE", c.Env)
	}
	var exposed []string
	for p := range c.ExposedPorts {
		exposed = append(exposed, p)
	}
	var wantPorts []string
	for _, p := range want.Ports {
		wantPorts = append(wantPorts, strconv.Itoa(p)+"/tcp")
	}
	slices.Sort(exposed)
	slices.Sort(wantPorts)
	if !slices.Equal(exposed, wantPorts) {
		t.Errorf("ExposedPorts %v, want %v", exposed, wantPorts)
	}
	if c.Labels["org.opencontainers.image.source"] != "https://github.com/conclave-ai/conclave" || c.Labels["org.opencontainers.image.revision"] != revision ||
		c.Labels["org.opencontainers.image.version"] != version || c.Labels["org.opencontainers.image.title"] != "conclave/"+want.Name {
		t.Errorf("labels %v", c.Labels)
	}

	files := flatten(t, img)
	certs, err := os.ReadFile(CACertsPath)
	if err != nil {
		t.Fatal(err)
	}
	if f := files["etc/ssl/certs/ca-certificates.crt"]; !bytes.Equal(f.body, certs) {
		t.Errorf("the image's CA bundle (%d bytes) differs from %s (%d bytes)", len(f.body), CACertsPath, len(certs))
	}
	passwd := string(files["etc/passwd"].body)
	for _, want := range []string{"root:x:0:0:", "nonroot:x:65532:65532:nonroot:/home/nonroot:"} {
		if !strings.Contains(passwd, want) {
			t.Errorf("/etc/passwd lacks %q:\n%s", want, passwd)
		}
	}
	if !strings.Contains(string(files["etc/group"].body), "nonroot:x:65532:") {
		t.Errorf("/etc/group lacks nonroot:\n%s", files["etc/group"].body)
	}
	for _, d := range []struct {
		path  string
		mode  int64
		owner int
	}{
		{"tmp", 0o1777, 0},
		{"home/nonroot", 0o700, NonrootUID},
	} {
		h := files[d.path].header
		if h == nil || h.Typeflag != tar.TypeDir || h.Mode != d.mode || h.Uid != d.owner {
			t.Errorf("%s: header %+v, want a directory of mode %o owned by %d", d.path, h, d.mode, d.owner)
		}
	}
	bin := files[strings.TrimPrefix(binPath, "/")]
	if bin.header == nil || bin.header.Typeflag != tar.TypeReg || bin.header.Mode != 0o755 {
		t.Fatalf("%s: header %+v, want a regular file of mode 755", binPath, bin.header)
	}
	assertELF(t, binPath, bin.body, machines[testArch])
	return files
}

// machines are the ELF machines of the architectures images are built for.
var machines = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// checkAgentHostInstall runs the agent-host binary unpacked from its image
// as the Kubernetes executor's init container does, `agent-host install
// <path>`, and checks it copied itself there, executable: the image holds
// the real agent-host, which needs no shell to install.
func checkAgentHostInstall(t *testing.T, binary []byte) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "agent-host")
	if err := os.WriteFile(bin, binary, 0o755); err != nil {
		t.Fatal(err)
	}
	dest := filepath.Join(dir, "pod", "agent-host")
	if err := os.Mkdir(filepath.Dir(dest), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.CommandContext(t.Context(), bin, "install", dest).CombinedOutput(); err != nil {
		t.Fatalf("agent-host install %s: %v\n%s", dest, err, out)
	}
	installed, err := os.ReadFile(dest)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(installed, binary) {
		t.Errorf("agent-host install wrote %d bytes, not its own %d", len(installed), len(binary))
	}
	if fi, err := os.Stat(dest); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("installed agent-host: %v, %v; want mode 0755", fi, err)
	}
}

type layerFile struct {
	header *tar.Header
	body   []byte
}

// flatten reads the image's filesystem as a runtime would unpack it.
func flatten(t *testing.T, img v1.Image) map[string]layerFile {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	files := map[string]layerFile{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = layerFile{header: h, body: body}
	}
}

func assertELF(t *testing.T, name string, data []byte, machine elf.Machine) {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("%s is not ELF: %v", name, err)
	}
	if f.Machine != machine || f.Type != elf.ET_EXEC {
		t.Errorf("%s: %s %s, want an executable for %s", name, f.Type, f.Machine, machine)
	}
}

// checkLibrarianZip checks the Librarian's Lambda zip: one executable file,
// bootstrap, an arm64 ELF.
func checkLibrarianZip(t *testing.T, path string) {
	zr, err := zip.OpenReader(path)
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	if len(zr.File) != 1 || zr.File[0].Name != "bootstrap" {
		var names []string
		for _, f := range zr.File {
			names = append(names, f.Name)
		}
		t.Fatalf("zip holds %q, want only bootstrap", names)
	}
	f := zr.File[0]
	if mode := f.Mode(); !mode.IsRegular() || mode.Perm() != 0o755 {
		t.Errorf("bootstrap mode %s, want -rwxr-xr-x", mode)
	}
	if !f.Modified.Equal(testEpoch) {
		t.Errorf("bootstrap modified %s, want %s", f.Modified, testEpoch)
	}
	rc, err := f.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	assertELF(t, "bootstrap", data, elf.EM_AARCH64)
}

// executorImages are the images the runner's Kubernetes executor runs. Its
// pods set runAsNonRoot without a runAsUser, so the kubelet must see a
// numeric non-root user in the image: their Dockerfiles say USER
// 65532:65532 where the services' say nonroot:nonroot (the chart sets the
// services' runAsUser).
var executorImages = []string{"agent-host", "acp-agent"}

// TestImagesMatchDockerfilesAndConfig checks the image table against what
// the Dockerfiles build and the ports the services' Config listens on by
// default, so the offline images and the Docker ones cannot drift apart.
func TestImagesMatchDockerfilesAndConfig(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	listenDefault := regexp.MustCompile("config\\.ListenAddr\\s+`env:\"[^\"]+\" default:\":(\\d+)\"")
	for _, img := range Images {
		t.Run(img.Name, func(t *testing.T) {
			t.Parallel()
			dockerfile, err := os.ReadFile(filepath.Join(root, img.Dockerfile))
			if err != nil {
				t.Fatal(err)
			}
			df := string(dockerfile)
			var exposed []int
			var user string
			for line := range strings.SplitSeq(df, "\n") {
				if ports, ok := strings.CutPrefix(line, "EXPOSE "); ok {
					for _, p := range strings.Fields(ports) {
						n, err := strconv.Atoi(p)
						if err != nil {
							t.Fatalf("EXPOSE %q", p)
						}
						exposed = append(exposed, n)
					}
				}
				if u, ok := strings.CutPrefix(line, "USER "); ok {
					user = strings.TrimSpace(u)
				}
			}
			if !slices.Equal(exposed, img.Ports) {
				t.Errorf("Dockerfile exposes %v, the offline image %v", exposed, img.Ports)
			}
			if want := `ENTRYPOINT ["/usr/local/bin/` + img.Binary + `"]`; !strings.Contains(df, want) {
				t.Errorf("Dockerfile lacks %s", want)
			}
			if want := "/out/" + img.Binary + " " + img.Package + "\n"; !strings.Contains(df, want) {
				t.Errorf("Dockerfile does not build %s as /out/%s", img.Package, img.Binary)
			}
			wantUser := "nonroot:nonroot"
			if slices.Contains(executorImages, img.Name) {
				wantUser = "65532:65532"
			}
			if user != wantUser {
				t.Errorf("Dockerfile's final USER is %q, want %s", user, wantUser)
			}

			service := filepath.Join(root, "services", img.Name, "service", "service.go")
			if img.Package != "./services/"+img.Name+"/cmd/"+img.Name {
				// Not a service: it listens on nothing.
				if len(img.Ports) != 0 {
					t.Errorf("%s is no service but exposes %v", img.Name, img.Ports)
				}
				return
			}
			src, err := os.ReadFile(service)
			if err != nil {
				t.Fatal(err)
			}
			var defaults []int
			for _, m := range listenDefault.FindAllStringSubmatch(string(src), -1) {
				n, _ := strconv.Atoi(m[1])
				defaults = append(defaults, n)
			}
			if !slices.Equal(defaults, img.Ports) {
				t.Errorf("service.Config listens on %v by default, the image exposes %v", defaults, img.Ports)
			}
		})
	}
}

// TestImagesMatchChart checks that the tarballs' tags are what the Helm
// chart asks for by default: conclave/<name>:<appVersion> (the deployables'
// images, the console's among them, agent-host's, agentHost.image, and the
// example agent's, exampleAgent.image).
func TestImagesMatchChart(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	version, err := ChartVersion(root)
	if err != nil {
		t.Fatal(err)
	}
	b := &Builder{Version: version}
	values, err := os.ReadFile(filepath.Join(root, "helm", "conclave", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"gateway", "bus", "runner", "console", "agent-host", "acp-agent"} {
		img, _ := Lookup(name)
		ref, err := b.Ref(img)
		if err != nil {
			t.Fatal(err)
		}
		if ref.RepositoryStr() != "conclave/"+name || ref.TagStr() != b.Version {
			t.Errorf("%s is tagged %s", name, ref)
		}
		if !strings.Contains(string(values), "repository: "+ref.RepositoryStr()+"\n") {
			t.Errorf("the chart's values.yaml has no repository: %s", ref.RepositoryStr())
		}
	}
}

func TestBaseNeedsTheCABundle(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "empty.crt")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path, want string
	}{
		{"missing", filepath.Join(dir, "missing.crt"), "install Debian's ca-certificates package"},
		{"not PEM", notPEM, "holds no PEM certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := (&Builder{CACerts: tc.path}).Base()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Base with %s: %v, want an error saying %q", tc.path, err, tc.want)
			}
		})
	}
}

func TestSourceDateEpoch(t *testing.T) {
	for _, tc := range []struct {
		value   string
		want    time.Time
		wantErr bool
	}{
		{"", time.Unix(0, 0).UTC(), false},
		{"1700000000", time.Unix(1700000000, 0).UTC(), false},
		{"-1", time.Time{}, true},
		{"yesterday", time.Time{}, true},
	} {
		t.Run(tc.value, func(t *testing.T) {
			t.Setenv("SOURCE_DATE_EPOCH", tc.value)
			got, err := SourceDateEpoch()
			if (err != nil) != tc.wantErr || !got.Equal(tc.want) {
				t.Errorf("SOURCE_DATE_EPOCH=%q: %s, %v", tc.value, got, err)
			}
		})
	}
}

func TestZipTime(t *testing.T) {
	t.Parallel()
	floor := time.Date(1980, 1, 1, 0, 0, 0, 0, time.UTC)
	later := time.Unix(1700000000, 0).UTC()
	for in, want := range map[time.Time]time.Time{time.Unix(0, 0): floor, later: later} {
		if got := zipTime(in); !got.Equal(want) {
			t.Errorf("zipTime(%s) = %s, want %s", in, got, want)
		}
	}
}

// TestEveryImageIsBuilt keeps TestCommand building every image the table
// names, so that a new one cannot ship untested.
func TestEveryImageIsBuilt(t *testing.T) {
	if !slices.Equal(testedImages, Names()) {
		t.Errorf("TestCommand builds %v, the table has %v", testedImages, Names())
	}
}

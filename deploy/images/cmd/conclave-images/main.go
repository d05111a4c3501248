// Command conclave-images builds Conclave's container images offline into
// `docker save` tarballs, and the Librarian's Lambda zip (`make images`).
//
//	conclave-images [-root DIR] [-out DIR] [-arch amd64|arm64] [-tag TAG] [NAME ...]
//
// NAME is gateway, bus, runner, console, agent-host, acp-agent or
// librarian (the zip); with no NAME it builds them all. Each image is written as <out>/<NAME>.tar tagged
// conclave/<NAME>:<TAG>, the zip as <out>/librarian.zip. Timestamps come
// from SOURCE_DATE_EPOCH (1970 when unset), so a commit builds to the same
// digests every time.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/conclave-ai/conclave/deploy/images"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "conclave-images:", err)
		os.Exit(1)
	}
}

// librarian is the name that selects the Librarian's zip.
const librarian = "librarian"

func run(ctx context.Context, args []string) error {
	fl := flag.NewFlagSet("conclave-images", flag.ContinueOnError)
	root := fl.String("root", ".", "repository root (holds go.work)")
	out := fl.String("out", "", "output directory (default <root>/.cache/images)")
	arch := fl.String("arch", "amd64", "the images' architecture: amd64 or arm64 (the Librarian's zip is always arm64)")
	tag := fl.String("tag", "", "the images' tag (default helm/conclave's appVersion)")
	source := fl.String("source", "https://github.com/conclave-ai/conclave", "org.opencontainers.image.source label")
	caCerts := fl.String("ca-certs", images.CACertsPath, "CA bundle of Debian's ca-certificates package")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if *arch != "amd64" && *arch != "arm64" {
		return fmt.Errorf("-arch %q: want amd64 or arm64", *arch)
	}
	rootDir, err := filepath.Abs(*root)
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(rootDir, "go.work")); err != nil {
		return fmt.Errorf("-root %s is not the repository root: %w", rootDir, err)
	}
	outDir := *out
	if outDir == "" {
		outDir = filepath.Join(rootDir, ".cache", "images")
	}

	var selected []images.Image
	withZip := fl.NArg() == 0
	if withZip {
		selected = images.Images
	}
	for _, n := range fl.Args() {
		if n == librarian {
			withZip = true
			continue
		}
		img, ok := images.Lookup(n)
		if !ok {
			return fmt.Errorf("no image %q: want one of %s or %s", n, strings.Join(images.Names(), ", "), librarian)
		}
		selected = append(selected, img)
	}

	created, err := images.SourceDateEpoch()
	if err != nil {
		return err
	}
	version := *tag
	if version == "" {
		if version, err = images.ChartVersion(rootDir); err != nil {
			return fmt.Errorf("no -tag, and the chart's version: %w", err)
		}
	}
	b := &images.Builder{
		Root:     rootDir,
		Arch:     *arch,
		CACerts:  *caCerts,
		Created:  created,
		Source:   *source,
		Revision: images.Revision(ctx, rootDir),
		Version:  version,
		Log:      os.Stderr,
	}

	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "conclave-images-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)

	if len(selected) > 0 {
		base, err := b.Base()
		if err != nil {
			return err
		}
		for _, img := range selected {
			if err := buildOne(ctx, b, base, img, outDir, work); err != nil {
				return err
			}
		}
	}
	if withZip {
		path := filepath.Join(outDir, "librarian.zip")
		if err := b.BuildLibrarianZip(ctx, path, work); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "images: %s (bootstrap, linux/arm64)\n", path)
	}
	return nil
}

func buildOne(ctx context.Context, b *images.Builder, base v1.Image, img images.Image, outDir, work string) error {
	built, err := b.Build(ctx, base, img, work)
	if err != nil {
		return err
	}
	ref, err := b.Ref(img)
	if err != nil {
		return err
	}
	path := filepath.Join(outDir, img.Name+".tar")
	if err := images.WriteTarball(path, ref, built); err != nil {
		return err
	}
	digest, err := built.Digest()
	if err != nil {
		return fmt.Errorf("digest of %s: %w", img.Name, err)
	}
	fmt.Fprintf(os.Stderr, "images: %s %s %s\n", path, ref, digest)
	return nil
}

# Conclave's build, test and development entry points. `make help` lists them.
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

ROOT      := $(abspath .)
CACHE     := $(ROOT)/.cache
BIN       := $(CACHE)/bin
BUF       := $(ROOT)/node_modules/.bin/buf
# Every Go module in the workspace, plus the tools module outside it.
MODULES   := proto pkg services/gateway services/bus services/runner services/bridge services/console functions/librarian cmd/conclave examples/acp-agent examples/coven-agent bench infra deploy/kubetest e2e
# Modules outside go.work (GOWORK=off): their build lists must not reach the
# services'. deploy/observability checks the dashboards and alert rules with
# Prometheus' own parsers; helm checks the chart, skaffold.yaml and the
# Dockerfiles with k8s.io/api's types (kept out of the services' build list);
# deploy/images builds the offline images with go-containerregistry.
STANDALONE := deploy/observability helm deploy/images
GO_TOOLS  := protoc-gen-go protoc-gen-go-grpc protoc-gen-grpc-gateway protoc-gen-openapiv2 grpcurl staticcheck
# -timeout is a hang guard per test binary; it also counts a real-node
# suite's wait for the node another one holds (docs/testing.md).
TEST_FLAGS ?= -race -count=1 -timeout=30m
# How many compiles and test binaries `make test` runs at once, above the 2
# cores on purpose: many test binaries mostly wait (on processes they
# started, the real node, Jaeger), and compiles fill that time.
TEST_PARALLEL ?= 4
# The workspace modules' packages, as one go test sees them.
WORKSPACE_PKGS := $(foreach m,$(MODULES),./$(m)/...)

.PHONY: help
help: ## List the targets.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# Tool binaries are built once into .cache/bin from the pinned tools module
# and reused; the stamp depends on the tools module's go.mod and go.sum so a
# version bump rebuilds them.
$(BIN)/.stamp: tools/go.mod tools/go.sum
	@mkdir -p $(BIN)
	cd tools && GOWORK=off go build -o $(BIN)/ $(addprefix ,$(shell cd tools && GOWORK=off go list -f '{{.ImportPath}}' tool))
	@touch $@

node_modules/.stamp: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	@touch $@

.PHONY: tools
tools: $(BIN)/.stamp node_modules/.stamp ## Build the code generators, grpcurl and staticcheck; install the npm packages.

.PHONY: test-deps
test-deps: ## Install the Debian packages the integration tests use (nginx, chromium, containerd, CNI plugins, iptables).
	scripts/install-test-deps.sh

.PHONY: test-tools
test-tools: ## Build kube-apiserver, etcd, the node (kubelet, controller-manager, scheduler, kube-proxy), jaeger-all-in-one and helm into .cache/bin (skips what is up to date).
	scripts/build-test-tools.sh

# conclave-images is the repository's own code, not a pinned third-party tool:
# it is built beside the shared .cache/bin, not into it, and rebuilt whenever
# its sources change.
IMAGES_TOOL := $(CACHE)/tool/conclave-images
# The images' architecture (amd64 or arm64; the Librarian's zip is arm64).
IMAGES_ARCH ?= amd64
# Every timestamp in the images and the zip: the last commit's, so one commit
# always builds to the same digests.
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)

$(IMAGES_TOOL): deploy/images/go.mod deploy/images/go.sum $(filter-out %_test.go,$(wildcard deploy/images/*.go deploy/images/cmd/conclave-images/*.go))
	@mkdir -p $(@D)
	cd deploy/images && GOWORK=off go build -o $@ ./cmd/conclave-images

.PHONY: images
images: $(IMAGES_TOOL) ## Build the gateway, bus, runner, console, agent-host and acp-agent images offline into .cache/images/*.tar, and the Librarian's zip.
	SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) $(IMAGES_TOOL) -root $(ROOT) -out $(CACHE)/images -arch $(IMAGES_ARCH)

.PHONY: librarian-zip
librarian-zip: $(IMAGES_TOOL) ## Build only the Librarian's arm64 Lambda zip, .cache/images/librarian.zip.
	SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) $(IMAGES_TOOL) -root $(ROOT) -out $(CACHE)/images librarian

.PHONY: build
build: ## Build the conclave binary, and the example ACP agent conclave dev runs, into bin/.
	@mkdir -p bin
	go build -o bin/conclave ./cmd/conclave
	go build -o bin/acp-agent ./examples/acp-agent

.PHONY: run
run: build ## Build and run `conclave dev`: every service in one process on embedded storage.
	./bin/conclave dev

# The workspace's modules are tested by one go test, not one after the
# other: it compiles each shared dependency once and runs the test binaries
# of every module side by side, TEST_PARALLEL at a time, so one module's
# waits overlap another's compiles. Before it, one go build compiles every
# main package as testenv.GoBuild builds the processes the tests start
# (static, -trimpath): test binaries that build them at once would each
# compile the same packages. The standalone modules' tests run beside the
# workspace's (bench/ci.md, ".ci/run on a fresh machine").
# What the tests need is installed side by side: the Debian packages and
# npm's downloads wait on the network, and the Go tools' builds fill the
# cores meanwhile (bench/ci.md).
.PHONY: test-setup
test-setup:
	@$(MAKE) --no-print-directory -j3 --output-sync=target tools test-tools test-deps

.PHONY: test
test: test-setup ## Install what the tests need, then run every module's tests with -race.
	@echo "==> go build (the processes the tests start)"
	CGO_ENABLED=0 go build -trimpath -buildvcs=false $$(go list -f '{{if eq .Name "main"}}{{.ImportPath}}{{end}}' $(WORKSPACE_PKGS))
	@$(MAKE) --no-print-directory -j2 --output-sync=target test-workspace test-standalone

.PHONY: test-workspace
test-workspace:
	@echo "==> go test $(MODULES)"
	go test $(TEST_FLAGS) -p $(TEST_PARALLEL) $(WORKSPACE_PKGS)

.PHONY: test-standalone
test-standalone:
	@for m in $(STANDALONE); do \
		echo "==> go test $$m (GOWORK=off)"; \
		(cd $$m && GOWORK=off go test $(TEST_FLAGS) ./...) || exit 1; \
	done

.PHONY: e2e
e2e: test-setup ## Run the end-to-end scenario (docs/e2e.md) in every shape: one process, split processes, Kubernetes.
	cd e2e && go test $(TEST_FLAGS) ./...

.PHONY: test-short
test-short: ## Run every module's unit tests only (-short), without real components.
	go test -short -count=1 $(WORKSPACE_PKGS)
	@for m in $(STANDALONE); do (cd $$m && GOWORK=off go test -short -count=1 ./...) || exit 1; done

# Lint type-checks the race build, the configuration `make test` compiles:
# after the tests, go vet and staticcheck reuse those compiled dependencies
# instead of compiling client-go, the AWS SDK and gRPC a second time
# (bench/ci.md, ".ci/run on a fresh machine"). No file in the repository
# has a race build tag, so nothing goes unchecked. Added to the GOFLAGS in
# effect (the environment's or go env's), not in place of them. The
# workspace's modules are linted by one go vet and one staticcheck, which
# load each shared dependency once.
LINT_GOFLAGS = $(strip $(shell go env GOFLAGS) -race)

.PHONY: lint
lint: tools ## go vet and staticcheck in every module, and buf lint.
	@echo "==> lint $(MODULES)"
	GOFLAGS="$(LINT_GOFLAGS)" go vet $(WORKSPACE_PKGS)
	GOFLAGS="$(LINT_GOFLAGS)" $(BIN)/staticcheck $(WORKSPACE_PKGS)
	@for m in $(STANDALONE); do \
		echo "==> lint $$m (GOWORK=off)"; \
		(cd $$m && GOWORK=off GOFLAGS="$(LINT_GOFLAGS)" go vet ./... && GOWORK=off GOFLAGS="$(LINT_GOFLAGS)" $(BIN)/staticcheck ./...) || exit 1; \
	done
	cd proto && $(BUF) lint

.PHONY: generate
generate: tools ## Regenerate the protobuf Go code and OpenAPI documents.
	cd proto && PATH="$(BIN):$$PATH" $(BUF) generate

.PHONY: generate-check
generate-check: tools ## Fail when the committed generated code differs from a fresh generation.
	PATH="$(BIN):$$PATH" BUF=$(BUF) scripts/generate-check.sh

.PHONY: tidy
tidy: ## go mod tidy in every module, the tools module included.
	@for m in $(MODULES); do echo "==> tidy $$m"; (cd $$m && go mod tidy) || exit 1; done
	cd tools && GOWORK=off go mod tidy
	@for m in $(STANDALONE); do echo "==> tidy $$m"; (cd $$m && GOWORK=off go mod tidy) || exit 1; done
	@for t in k8s jaeger helm; do echo "==> tidy tools/$$t"; (cd tools/$$t && GOWORK=off go mod tidy) || exit 1; done

.PHONY: bench
bench: ## Run every Go benchmark once, with allocations.
	@for m in $(MODULES); do \
		(cd $$m && go test -run='^$$' -bench=. -benchmem -benchtime=1x ./...) || exit 1; \
	done

.PHONY: clean
clean: ## Remove build outputs (keeps the tool cache).
	rm -rf bin

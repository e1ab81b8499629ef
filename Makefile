# devmgr build and checks. Every tool this file needs is either Go itself or
# installed by this file into ./bin at a pinned version.

GO              ?= go
BIN             := $(CURDIR)/bin
GOLANGCI_LINT_VERSION := v2.15.0
GOLANGCI_LINT   := $(BIN)/golangci-lint-$(GOLANGCI_LINT_VERSION)
BENCHSTAT_VERSION := v0.0.0-20260908200009-22c9c6c9d4da
BENCHSTAT       := $(BIN)/benchstat-$(BENCHSTAT_VERSION)
FUZZTIME        ?= 20s
BENCHCOUNT      ?= 6
BENCHTIME       ?= 1s
BENCH           ?= .
BENCHRUNS       ?= 5
PKGS            ?= ./...
# E2E_CACHE: where make e2e keeps the components it builds (default: the
# environment's DEVMGR_E2E_CACHE, else devmgr/e2e in the user's cache
# directory, ${XDG_CACHE_HOME:-$HOME/.cache}).
E2E_CACHE       ?= $(DEVMGR_E2E_CACHE)

.PHONY: all test vet lint fmt fmt-write tidy bench bench-compare bench-check compat e2e kubelet node-e2e fuzz verify interop reliability tools clean

all: verify test

## test: unit and integration tests, with the race detector and coverage.
test:
	$(GO) test -race -cover $(PKGS)

## vet: go vet.
vet:
	$(GO) vet $(PKGS)

## lint: golangci-lint with the curated .golangci.yml.
lint: $(GOLANGCI_LINT)
	$(GOLANGCI_LINT) run $(PKGS)

## fmt: fail if gofmt would change a file (fmt-write applies it).
fmt:
	@out=$$(gofmt -s -l $$(git ls-files '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt -s would change:"; echo "$$out"; exit 1; fi

fmt-write:
	gofmt -s -w $$(git ls-files '*.go')

## tidy: fail if go mod tidy would change go.mod or go.sum.
tidy:
	$(GO) mod tidy -diff

## bench: every benchmark, BENCHCOUNT times (feed the output to benchstat).
bench:
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchmem -benchtime $(BENCHTIME) -count $(BENCHCOUNT) $(PKGS)

## bench-compare: the same workloads against devmgr and against the kubelet's
## own device manager (k8s.io/kubernetes v1.37.2), each run in a fresh
## process, BENCHRUNS runs each; writes docs/PERFORMANCE.md. Needs root and
## unshare -m (the kubelet side runs in a private mount namespace). bench/ is
## a module of its own, so the library never depends on k8s.io/kubernetes.
bench-compare:
	cd bench && $(GO) run . compare -runs $(BENCHRUNS) -out ../docs/PERFORMANCE.md

## bench-check: bench/ (a module of its own, which make test does not reach)
## is tidy, passes go vet and its tests, which run every workload once against
## devmgr, so that a change to the library cannot break make bench-compare
## unnoticed. The first run downloads
## k8s.io/kubernetes and its dependencies (about 500 MB) and builds them
## (two to three minutes on two CPUs).
bench-check:
	cd bench && $(GO) mod tidy -diff && $(GO) vet ./... && $(GO) vet -tags devmgronly ./... && $(GO) vet -tags kubeletonly ./... && $(GO) test -count=1 ./...

## compat: kubeletcompat/ (a module of its own, which make test does not
## reach) is tidy, passes go vet and its tests, with the race detector. As
## root they run the kubelet's topology manager over the adapter and over the
## kubelet's own device manager (k8s.io/kubernetes v1.37.2), in a private
## mount namespace, so they need root and unshare -m: without them they fail,
## saying why.
compat:
	cd kubeletcompat && $(GO) mod tidy -diff && $(GO) vet ./... && $(GO) test -race -count=1 ./...

## e2e: e2e/ (a module of its own, so the library never depends on
## k8s.io/kubernetes) is tidy, passes go vet, and its test runs devmgr serve
## --kubeconfig against a real etcd, kube-apiserver and kube-scheduler on
## loopback, logging each figure it checks (FIGURE lines). The components
## build once into a cache outside the repository, E2E_CACHE (default
## ${XDG_CACHE_HOME:-$HOME/.cache}/devmgr/e2e), under their versions' names
## (kube-apiserver and kube-scheduler from k8s.io/kubernetes, pinned in
## e2e/go.mod; etcd from e2e/etcd, a module of its own); the log says where,
## and how long each build took. Needs no root.
e2e:
	cd e2e && $(GO) mod tidy -diff && (cd etcd && $(GO) mod tidy -diff) && $(GO) vet ./... && \
		DEVMGR_E2E_CACHE='$(abspath $(E2E_CACHE))' $(GO) test -count=1 -v -timeout 30m ./...

## kubelet: the kubelet of k8s.io/kubernetes (the version kubelet/go.mod
## requires) with devmgr as its device manager, built into E2E_CACHE; the
## last line printed is the binary's path. No fork: the build overlays the
## kubelet's source with one added file (kubelet/cm/devmgr.go) and one
## changed line, checked against the kubelet version they were written for
## (docs/KUBELET.md). KUBELET_FLAGS=-stock builds the stock kubelet of the
## same module graph.
KUBELET_FLAGS ?=
kubelet:
	@cd kubelet && DEVMGR_E2E_CACHE='$(abspath $(E2E_CACHE))' $(GO) run . $(KUBELET_FLAGS)

## node-e2e: the stock kubelet and make kubelet's on a real node (containerd,
## runc, a bridge network, real pods), the same scenarios on both, then pods
## moved between them; writes docs/NODE-E2E.md. Needs root and the host
## packages runc, containernetworking-plugins, busybox-static (.ci/run
## installs them); the node runs in private mount, network and PID
## namespaces and never touches the host's /var/lib/kubelet. The kubelet/,
## nodee2e/ and nodee2e/containerd modules are tidy and vetted first, and
## the kubelet builder's tests run. Components are cached as make e2e's.
node-e2e:
	cd kubelet && $(GO) mod tidy -diff && $(GO) vet ./... && $(GO) test -count=1 ./...
	cd nodee2e && $(GO) mod tidy -diff && (cd containerd && $(GO) mod tidy -diff) && $(GO) vet ./... && \
		DEVMGR_E2E_CACHE='$(abspath $(E2E_CACHE))' $(GO) test -count=1 -v -timeout 40m . -args -report $(CURDIR)/docs/NODE-E2E.md

## fuzz: every fuzz target for FUZZTIME each (.ci/fuzz-target runs one).
fuzz:
	@set -e; for f in $$(git grep -l '^func Fuzz' -- '*_test.go'); do \
		dir=./$$(dirname $$f); \
		for t in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$f); do \
			echo "== $$dir $$t ($(FUZZTIME))"; \
			GO=$(GO) ./.ci/fuzz-target $$dir $$t $(FUZZTIME); \
		done; \
	done

## interop: devmgr against device plugins nobody on the team wrote (needs
## root and unshare -m; the first run downloads and builds them into .cache),
## and the quirk tests of real plugins' behaviour.
interop:
	$(GO) test -tags interop -v -count=1 -timeout 20m ./interop/
	$(GO) test -race -count=1 -run 'Quirk' ./devicemanager/

## reliability: the reliability suite (crash consistency under SIGKILL and
## under power loss, both also through devmgr serve; plugin faults, churn,
## bad registrations, checkpoint damage, load, permissions) with the default
## counts, then docs/RELIABILITY.md from its figures, also when a test failed
## (the file says so, and the target fails). LAZYFS is the path of a LazyFS
## binary, with its libpcache.so beside it: a FUSE file system that loses
## unsynced data on command, which the power-loss categories mount. Without
## it they are skipped, and RELIABILITY.md says so; with
## RELIABILITY_REQUIRE_LAZYFS=1 (as in .ci/run, which builds it) they fail
## instead. Larger counts:
## make reliability LAZYFS=... RELIABILITY_FLAGS="-kills 2000 -losses 1000 -flips 20000".
## LazyFS and the read-only mount cases need root; the latter also unshare -m.
LAZYFS            ?=
RELIABILITY_FLAGS ?=
RELIABILITY_REQUIRE_LAZYFS ?=
RELIABILITY_OUT   := $(CURDIR)/.cache/reliability
RELIABILITY_ARGS   = -report $(RELIABILITY_OUT)/figures.jsonl $(if $(LAZYFS),-lazyfs $(abspath $(LAZYFS))) \
	$(if $(filter 1,$(RELIABILITY_REQUIRE_LAZYFS)),-require-lazyfs) $(RELIABILITY_FLAGS)
reliability:
	@mkdir -p $(RELIABILITY_OUT) && rm -f $(RELIABILITY_OUT)/figures.jsonl
	@echo "$(GO) test -tags reliability -count=1 -v -timeout 20m ./reliability/ -args $(RELIABILITY_ARGS)"
	@{ $(GO) test -tags reliability -count=1 -v -timeout 20m ./reliability/ \
		-args $(RELIABILITY_ARGS) 2>&1; \
		echo $$? > $(RELIABILITY_OUT)/status; } | tee $(RELIABILITY_OUT)/test.log
	@status=$$(cat $(RELIABILITY_OUT)/status); \
	$(GO) run ./reliability/report -in $(RELIABILITY_OUT)/figures.jsonl -log $(RELIABILITY_OUT)/test.log \
		-status $$status -out docs/RELIABILITY.md \
		-cmd 'make reliability$(if $(LAZYFS), LAZYFS=$(patsubst $(CURDIR)/%,%,$(abspath $(LAZYFS))))$(if $(RELIABILITY_FLAGS), RELIABILITY_FLAGS="$(RELIABILITY_FLAGS)")' && \
	echo "wrote docs/RELIABILITY.md" && \
	$(if $(LAZYFS),true,echo "power loss: NOT TESTED (no LAZYFS); make reliability LAZYFS=PATH runs it") && exit $$status

## verify: every static check (formatting, module tidiness, vet, lint).
verify: fmt tidy vet lint

## tools: install the pinned tools into ./bin.
tools: $(GOLANGCI_LINT) $(BENCHSTAT)

# Tools are installed under a versioned name, so changing a pin reinstalls.
$(GOLANGCI_LINT):
	GOBIN=$(BIN)/.install $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv $(BIN)/.install/golangci-lint $@

$(BENCHSTAT):
	GOBIN=$(BIN)/.install $(GO) install golang.org/x/perf/cmd/benchstat@$(BENCHSTAT_VERSION)
	mv $(BIN)/.install/benchstat $@

clean:
	rm -rf $(BIN)

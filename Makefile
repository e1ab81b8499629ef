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
PKGS            ?= ./...

.PHONY: all test vet lint fmt fmt-write tidy bench fuzz verify interop tools clean

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

## fuzz: every fuzz target for FUZZTIME each.
fuzz:
	@set -e; for f in $$(git grep -l '^func Fuzz' -- '*_test.go'); do \
		dir=./$$(dirname $$f); \
		for t in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$f); do \
			echo "== $$dir $$t ($(FUZZTIME))"; \
			$(GO) test -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) $$dir; \
		done; \
	done

## interop: devmgr against device plugins nobody on the team wrote (needs
## root and unshare -m; the first run downloads and builds them into .cache),
## and the quirk tests of real plugins' behaviour.
interop:
	$(GO) test -tags interop -v -count=1 -timeout 20m ./interop/
	$(GO) test -race -count=1 -run 'Quirk' ./devicemanager/

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

# make lab    runs the ORDER-003 lab on embedded defaults (no server needed)
# make test   installs and starts every server the tests need, then vets and
#             runs the whole suite with the race detector
# make bench  runs dev/bench: a Watermill router with and without the
#             middleware on every store, against raw store writes, interleaved,
#             with medians and ratios, allocations and Redis used_memory per record
#             (BENCHFLAGS passes flags, e.g. BENCHFLAGS='-stores redis,redis-ap -reps 3'
#             or '-redis-records none'); then a Kafka batch consumer (kfake, each
#             poll one Engine.DoBatch on Redis) against the same consumer without
#             dedup and against two raw pipelines per poll (-kafka-batch;
#             KAFKABENCHFLAGS passes flags, e.g. '-reps 3 -kafka-records 5000');
#             then the Redis store's WaitReplicas go test benchmark
# make bench-batch  batch claims: per-record Engine.Do against Engine.DoBatch and
#             the raw floor, for batches of 1, 10, 100 new keys on every store
# make bench-stores  the older per-store go test benchmarks
# make soak   a million messages through a Watermill router with the dedup
#             middleware on Redis (AOF) and on PostgreSQL, consumer processes
#             SIGKILLed and restarted every few seconds (reliability/soak;
#             SOAKFLAGS passes go test flags; `make test` runs 20,000). The
#             linearizability histories (reliability/linear) run about five
#             times longer with LINEAR_LONG=1.

GO ?= go
TEST_TIMEOUT ?= 20m
# TEST_P packages are tested at once (go test -p; Go's default is one per
# core). The longest packages mostly wait (on failovers, leases, a
# DynamoDB emulator that serves one request at a time), so on 2 cores 4
# at once took the suite from 860 s to about 450 s; beside two CPU-bound
# processes 4 starved the emulators; 3 took 635 s idle and 889 s beside
# two there, 411 s and 599 s on a faster machine (docs/dev/test-suite.md).
TEST_P ?= 3

# The repository holds several modules (go.work lists them): the library's
# root module, one module per store and adapter, the tools. In the
# workspace this pattern names every package of every module, so that one
# `go vet` and one `go test` run them all, in parallel.
ALL := github.com/watermill-dedup/watermill-dedup/...

# The longest packages, longest first, named before the pattern so that go
# test starts them first (it runs packages in the order it is given them,
# and the pattern alone gives path order: a long package late in it runs
# alone at the end). Most of them wait on servers, so the short packages
# fill the other slots meanwhile (docs/dev/test-suite.md says how to time
# the suite and find them).
SLOW := $(addprefix github.com/watermill-dedup/watermill-dedup/,docs/model stores/dynamo docs stores/redis reliability/txcrash reliability reliability/linear reliability/soak dev/release)

.PHONY: test deps vet modules api lab bench bench-batch bench-stores fuzz soak

test: deps vet modules
	$(GO) test -race -count=1 -p $(TEST_P) -timeout $(TEST_TIMEOUT) $(SLOW) $(ALL)

deps:
	bash scripts/ensure-test-deps.sh

vet:
	@unformatted=$$(git ls-files '*.go' | xargs gofmt -l); \
	if [ -n "$$unformatted" ]; then echo "gofmt -w these files:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet $(ALL)

# Each module's go.mod and go.sum are tidy (GOWORK=off go mod tidy -diff,
# the siblings resolved through the replace directives they keep between
# releases). A user's module graph, which ignores go.work and replace, is
# not checked here: dev/release's TestUserBuild, run by `go test` below,
# packs every module a release would tag into a file-system module proxy
# and builds the README's Quick start, a DynamoDB consumer, a Lambda
# handler and `go install …/cmd/dedupctl@version` against it.
modules:
	bash scripts/check-modules.sh

# Rewrites each library module's api.txt from the code (the API test fails
# while the two differ).
api:
	$(GO) run ./dev/apidump -write

lab:
	$(GO) run ./dev/lab

BENCHFLAGS ?=
KAFKABENCHFLAGS ?=
bench: deps
	$(GO) run ./dev/bench $(BENCHFLAGS)
	$(GO) run ./dev/bench -kafka-batch $(KAFKABENCHFLAGS)
	$(GO) test -run '^$$' -bench WaitReplicas -benchtime 3000x ./stores/redis/

bench-batch: deps
	$(GO) run ./dev/bench -batch 1,10,100 $(BENCHFLAGS)

bench-stores: deps
	$(GO) test -run '^$$' -bench Store -benchtime 2s ./stores/redis/
	$(GO) test -run '^$$' -bench WaitReplicas -benchtime 3000x ./stores/redis/
	$(GO) test -run '^$$' -bench AutoPipeline -benchtime 20000x ./stores/redis/
	$(GO) test -run '^$$' -bench Throughput ./stores/dynamo/
	$(GO) test -run '^$$' -bench . -benchtime 500x ./stores/postgres/
	$(GO) test -run '^$$' -bench MiddlewareOverhead -benchmem ./dedup/

# A million messages per store, without the race detector (a run of the
# default 20,000 is part of `make test`).
SOAK_MESSAGES ?= 1000000
SOAKFLAGS ?=
soak: deps
	SOAK_MESSAGES=$(SOAK_MESSAGES) $(GO) test -count=1 -run Soak -timeout 4h -v $(SOAKFLAGS) ./reliability/soak/

# Runs each fuzz target for FUZZTIME (the seed corpus already runs in `make test`).
FUZZTIME ?= 30s
fuzz:
	$(GO) test ./keyfuncs -run '^$$' -fuzz '^FuzzJSON$$' -fuzztime $(FUZZTIME)
	$(GO) test ./keyfuncs -run '^$$' -fuzz '^FuzzSNSEnvelope$$' -fuzztime $(FUZZTIME)
	$(GO) test ./keyfuncs -run '^$$' -fuzz '^FuzzMetadataJoin$$' -fuzztime $(FUZZTIME)
	$(GO) test ./keyfuncs -run '^$$' -fuzz '^FuzzJoinInjective$$' -fuzztime $(FUZZTIME)
	for f in FuzzMetadata FuzzPrefix FuzzFirstOf FuzzMiddlewareInput FuzzScopedKeyInjective; do \
		$(GO) test ./reliability -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) || exit 1; done

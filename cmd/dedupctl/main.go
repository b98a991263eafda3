// Command dedupctl inspects, evicts, lists and summarizes the records of a
// dedup store (Redis, DynamoDB or PostgreSQL), for operators.
//
//	dedupctl [flags] inspect [-scope S] KEY
//	dedupctl [flags] evict   [-scope S] KEY
//	dedupctl [flags] list    [-scope S] [-prefix P] [-limit N] [-cursor C] [-all]
//	dedupctl [flags] summary [-scope S] [-prefix P] [-all-scopes] [-page N] [-pace D]
//
// summary reads the whole store (no store has an index on key prefixes),
// one request per -pace, and refuses to start without -scope, -prefix or
// -all-scopes.
//
// KEY is a scoped key ("charge-orders:ORDER-003"), or with -scope a
// business key whose scoped key is admin.ScopedKey(scope, KEY). The stores
// are reached the way the examples and the lab reach them: Redis from
// REDIS_ADDR (or -redis-addr; comma-separated addresses mean a Cluster),
// DynamoDB from the AWS SDK's environment (AWS_ENDPOINT_URL or
// AWS_ENDPOINT_URL_DYNAMODB for a local emulator, AWS_REGION and credentials
// for AWS), PostgreSQL from DATABASE_URL or the PG* variables. A Redis
// whose maxmemory-policy evicts keys is opened with -allow-eviction only,
// with a warning.
//
// Exit status: 0 done; 1 error (store unreachable, unreadable record); 2
// usage (bad flags, missing key, invalid cursor); 3 no record under the key
// (inspect, evict). See README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/cmd/dedupctl/env/redisaddr"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
)

// Exit codes.
const (
	exitOK       = 0
	exitError    = 1
	exitUsage    = 2
	exitNotFound = 3
)

func main() {
	// go-redis logs failed dials on its own; the command reports the error.
	goredis.SetLogger(discardLogger{})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

type discardLogger struct{}

func (discardLogger) Printf(context.Context, string, ...any) {}

// options are the flags every command accepts, before or after its name.
type options struct {
	store     string
	jsonOut   bool
	timeout   time.Duration
	retention time.Duration
	scope     string

	redisAddr     string
	redisPrefix   string
	allowEviction bool
	dynamoTable   string
	// warnings receives warnings (stderr); not a flag.
	warnings io.Writer
	pgDSN    string
	pgTable  string
	pgSchema string

	// pace (summary only) is the least time between two requests that
	// read records: SCAN, DynamoDB Scan, a PostgreSQL page.
	pace time.Duration
}

func (o *options) register(fs *flag.FlagSet) {
	fs.StringVar(&o.store, "store", o.store, "store: redis, dynamo or postgres")
	fs.BoolVar(&o.jsonOut, "json", o.jsonOut, "print JSON instead of text")
	fs.DurationVar(&o.timeout, "timeout", o.timeout, "give up after this long")
	fs.DurationVar(&o.retention, "retention", o.retention, "the consumers' dedup.Config.Retention: shows when a completed record was completed, for stores that do not keep it (Redis, DynamoDB)")
	fs.StringVar(&o.scope, "scope", o.scope, "scope of KEY (KEY is then a business key) or of the listing")
	fs.StringVar(&o.redisAddr, "redis-addr", o.redisAddr, "Redis server: host:port, redis:// or rediss:// URL, or comma-separated Cluster nodes; $"+redisaddr.Env+" sets the default")
	fs.StringVar(&o.redisPrefix, "redis-prefix", o.redisPrefix, "the Redis store's KeyPrefix")
	fs.BoolVar(&o.allowEviction, "allow-eviction", o.allowEviction, "open a Redis whose maxmemory-policy evicts keys (which the consumers' store refuses unless AllowEviction), with a warning")
	fs.StringVar(&o.dynamoTable, "dynamo-table", o.dynamoTable, "DynamoDB table")
	fs.StringVar(&o.pgDSN, "postgres-dsn", o.pgDSN, "PostgreSQL connection string; $DATABASE_URL sets the default; empty: the PG* variables")
	fs.StringVar(&o.pgTable, "postgres-table", o.pgTable, "PostgreSQL table")
	fs.StringVar(&o.pgSchema, "postgres-schema", o.pgSchema, "PostgreSQL schema of the table (default: the search_path)")
}

func defaultOptions() options {
	return options{
		store:       "redis",
		timeout:     30 * time.Second,
		redisAddr:   os.Getenv(redisaddr.Env),
		redisPrefix: "dedup:",
		dynamoTable: "dedup",
		pgDSN:       os.Getenv("DATABASE_URL"),
		pgTable:     "dedup_keys",
	}
}

const usageText = `usage: dedupctl [flags] COMMAND [flags] [ARGS]

Commands:
  inspect KEY   show the record under KEY: state, lease or retention left,
                fingerprint, result size, creation time (PostgreSQL)
  evict KEY     delete the record under KEY whatever its state and owner, so
                that the next delivery of the message runs the handler again
  list          list records by key prefix, a page at a time
                  -prefix P   scoped-key prefix (after -scope: business-key prefix)
                  -limit N    records per page, 1..1000 (default 20)
                  -cursor C   continue a listing where its last page ended
                  -all        follow the cursors to the end
  summary       count the records of a scope: by state, the oldest in
                progress, the abandoned ones (lease passed, still in progress)
                  -scope S    the scope to count (or -prefix P)
                  -all-scopes every scope of the store, one line each
                  -page N     records per request, 1..1000 (default 1000)
                  -pace D     at least D between two requests (default 100ms)
                Cost: a full read of the store's keyspace, whatever the scope
                (no store has an index on key prefixes): Redis SCANs every key
                of the database, DynamoDB Scans (and bills) every item of the
                table, PostgreSQL reads every live row per page. -pace bounds
                the rate: one SCAN, one Scan request (up to 1000 items, 0.5
                read unit per 4 KB each) or one SELECT per D.

KEY is a scoped key, "<scope>:<business key>" (e.g. charge-orders:ORDER-003),
or a business key with -scope.

Exit status: 0 done, 1 error, 2 usage, 3 no record under KEY.

Flags (before or after COMMAND):
`

// run executes one command line and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	opts := defaultOptions()
	global := flag.NewFlagSet("dedupctl", flag.ContinueOnError)
	global.SetOutput(stderr)
	opts.register(global)
	global.Usage = func() {
		fmt.Fprint(global.Output(), usageText)
		global.PrintDefaults()
	}
	if err := global.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if global.NArg() == 0 {
		global.Usage()
		return exitUsage
	}
	command, rest := global.Arg(0), global.Args()[1:]

	fs := flag.NewFlagSet("dedupctl "+command, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = global.Usage
	opts.register(fs)
	var (
		prefix = fs.String("prefix", "", "list: scoped-key prefix")
		limit  = fs.Int("limit", 20, "list: records per page (1..1000)")
		cursor = fs.String("cursor", "", "list: cursor printed by the previous page")
		all    = fs.Bool("all", false, "list: follow the cursors to the end")
		every  = fs.Bool("all-scopes", false, "summary: count every scope (reads the whole store, as any summary does)")
		page   = fs.Int("page", admin.MaxListLimit, "summary: records per request (1..1000)")
	)
	if command == "summary" {
		opts.pace = 100 * time.Millisecond
		fs.DurationVar(&opts.pace, "pace", opts.pace, "summary: least time between two requests that read the store")
	}
	var wantArgs int
	switch command {
	case "inspect", "evict":
		wantArgs = 1
	case "list", "summary":
		wantArgs = 0
	case "help":
		global.SetOutput(stdout)
		global.Usage()
		return exitOK
	default:
		fmt.Fprintf(stderr, "dedupctl: unknown command %q (inspect, evict, list or summary)\n", command)
		return exitUsage
	}
	positional, err := parseInterleaved(fs, rest)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if len(positional) != wantArgs {
		if wantArgs == 1 {
			fmt.Fprintf(stderr, "dedupctl %s: want exactly one KEY, got %d arguments\n", command, len(positional))
		} else {
			fmt.Fprintf(stderr, "dedupctl %s: unexpected arguments %q (use -prefix)\n", command, positional)
		}
		return exitUsage
	}
	if command == "list" {
		if err := storekit.CheckListLimit(*limit); err != nil {
			fmt.Fprintf(stderr, "dedupctl list: -limit: %v\n", err)
			return exitUsage
		}
		if *all && *cursor != "" {
			fmt.Fprintln(stderr, "dedupctl list: -all starts from the beginning; drop -cursor")
			return exitUsage
		}
	}
	if command == "summary" {
		if err := summaryUsage(opts, *prefix, *every, *page); err != nil {
			fmt.Fprintf(stderr, "dedupctl summary: %v\n", err)
			return exitUsage
		}
	}
	if opts.timeout <= 0 || opts.retention < 0 {
		fmt.Fprintln(stderr, "dedupctl: -timeout must be positive and -retention not negative")
		return exitUsage
	}
	key := ""
	if wantArgs == 1 {
		key = positional[0]
		if opts.scope != "" {
			key = admin.ScopedKey(opts.scope, key)
		}
		if key == "" {
			fmt.Fprintf(stderr, "dedupctl %s: empty KEY\n", command)
			return exitUsage
		}
	}

	ctx, cancel := context.WithTimeout(ctx, opts.timeout)
	defer cancel()
	opts.warnings = stderr
	store, about, closeStore, err := openStore(ctx, opts)
	if err != nil {
		var u *usageError
		if errors.As(err, &u) {
			fmt.Fprintf(stderr, "dedupctl: %v\n", err)
			return exitUsage
		}
		fmt.Fprintf(stderr, "dedupctl: %v\n", err)
		return exitError
	}
	defer closeStore()

	out := &printer{w: stdout, json: opts.jsonOut, retention: opts.retention, now: time.Now, about: about}
	notFound := notFoundMessage(key, opts.scope)
	switch command {
	case "inspect":
		return inspect(ctx, store, key, notFound, out, stderr)
	case "evict":
		return evict(ctx, store, key, notFound, out, stderr)
	case "summary":
		p := *prefix
		if opts.scope != "" {
			p = admin.ScopePrefix(opts.scope) + p
		}
		sopts := admin.SummaryOptions{PageSize: *page}
		if opts.store == "postgres" { // Redis and DynamoDB pace each SCAN or Scan request (openStore)
			sopts.Pace = opts.pace
		}
		return summarize(ctx, store, p, opts.store, sopts, out, stderr)
	default:
		p := *prefix
		if opts.scope != "" {
			p = admin.ScopePrefix(opts.scope) + p
		}
		return list(ctx, store, p, *cursor, *limit, *all, out, stderr)
	}
}

// parseInterleaved parses flags and positional arguments in any order;
// everything after "--" is positional.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var tail []string
	for i, a := range args {
		if a == "--" {
			args, tail = args[:i], args[i+1:]
			break
		}
	}
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return append(positional, tail...), nil
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
}

// notFoundMessage is what inspect and evict say when no record is under
// key: with a hint to pass -scope when none was given (KEY is then taken
// as a scoped key, and a business key alone finds nothing).
func notFoundMessage(key, scope string) string {
	msg := fmt.Sprintf("dedupctl: no record under %q", key)
	if scope == "" {
		msg += fmt.Sprintf("; KEY is a scoped key, \"<scope>:<business key>\": if %q is a business key, pass -scope (the handler's name or dedup.Config.Scope), e.g. -scope charge-orders %s", key, key)
	}
	return msg
}

func inspect(ctx context.Context, a admin.Interface, key, notFound string, out *printer, stderr io.Writer) int {
	rec, err := a.Inspect(ctx, key)
	if errors.Is(err, admin.ErrNotFound) {
		fmt.Fprintln(stderr, notFound)
		return exitNotFound
	}
	if err != nil {
		fmt.Fprintf(stderr, "dedupctl: %v\n", err)
		return exitError
	}
	out.record(rec)
	return exitOK
}

func evict(ctx context.Context, a admin.Interface, key, notFound string, out *printer, stderr io.Writer) int {
	// What is about to be deleted, for the output; the record may change
	// before the delete, which does not look at it.
	before, inspectErr := a.Inspect(ctx, key)
	deleted, err := a.Evict(ctx, key)
	if err != nil {
		fmt.Fprintf(stderr, "dedupctl: %v\n", err)
		return exitError
	}
	if !deleted {
		fmt.Fprintln(stderr, notFound)
		return exitNotFound
	}
	var was *admin.Record
	if inspectErr == nil {
		was = &before
	}
	out.evicted(key, was)
	return exitOK
}

func list(ctx context.Context, a admin.Interface, prefix, cursor string, limit int, all bool, out *printer, stderr io.Writer) int {
	var records []admin.Record
	for {
		page, next, err := a.List(ctx, prefix, cursor, limit)
		if errors.Is(err, admin.ErrInvalidCursor) {
			fmt.Fprintf(stderr, "dedupctl: %v\n", err)
			return exitUsage
		}
		if err != nil {
			fmt.Fprintf(stderr, "dedupctl: %v\n", err)
			return exitError
		}
		if !all {
			out.page(prefix, page, next)
			return exitOK
		}
		records = append(records, page...)
		if next == "" {
			out.page(prefix, records, "")
			return exitOK
		}
		cursor = next
	}
}

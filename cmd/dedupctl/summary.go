package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
)

// pacer lets one request through per interval: the summary's bound on the
// load it puts on a store. The zero interval lets everything through.
type pacer struct {
	every time.Duration

	mu   sync.Mutex
	next time.Time // when the next request may start
}

// wait blocks until the next request may start, or ctx ends.
func (p *pacer) wait(ctx context.Context) error {
	if p == nil || p.every <= 0 {
		return nil
	}
	p.mu.Lock()
	now := time.Now()
	at := p.next
	if at.Before(now) {
		at = now
	}
	p.next = at.Add(p.every)
	p.mu.Unlock()
	d := time.Until(at)
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// scanPacer is a go-redis hook that paces SCAN commands.
type scanPacer struct{ p *pacer }

func (h scanPacer) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h scanPacer) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if strings.EqualFold(cmd.Name(), "scan") {
			if err := h.p.wait(ctx); err != nil {
				return err
			}
		}
		return next(ctx, cmd)
	}
}

func (h scanPacer) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

// paceRedis makes client wait for p before each SCAN (on every node of a
// Cluster or Ring). Call it before the client sends anything.
func paceRedis(client goredis.UniversalClient, p *pacer) {
	hook := scanPacer{p}
	switch c := client.(type) {
	case *goredis.ClusterClient:
		c.OnNewNode(func(node *goredis.Client) { node.AddHook(hook) })
	case *goredis.Ring:
		c.OnNewNode(func(node *goredis.Client) { node.AddHook(hook) })
	default:
		client.AddHook(hook)
	}
}

// pacedDynamo is a DynamoDB client whose Scan requests wait for a pacer.
type pacedDynamo struct {
	*dynamodb.Client
	p *pacer
}

func (c pacedDynamo) Scan(ctx context.Context, in *dynamodb.ScanInput, optFns ...func(*dynamodb.Options)) (*dynamodb.ScanOutput, error) {
	if err := c.p.wait(ctx); err != nil {
		return nil, err
	}
	return c.Client.Scan(ctx, in, optFns...)
}

// abandonedNote says why a store shows no abandoned records.
func abandonedNote(store string) string {
	switch store {
	case "redis":
		return "a Redis record expires with its lease: an abandoned key is free at once, none to count"
	case "postgres":
		return "not counted: PostgreSQL cannot tell a row whose lease ended from a released one"
	}
	return "not counted: the store does not list them"
}

// jsonScope is one scope of `summary -json`.
type jsonScope struct {
	Scope      string `json:"scope"`
	InProgress int    `json:"in_progress"`
	Completed  int    `json:"completed"`
	Unreadable int    `json:"unreadable"`
	// Abandoned is null where the store cannot list abandoned records.
	Abandoned        *int        `json:"abandoned"`
	OldestInProgress *jsonRecord `json:"oldest_in_progress,omitempty"`
	OldestAbandoned  *jsonRecord `json:"oldest_abandoned,omitempty"`
}

func (p *printer) summary(prefix, store string, s admin.Summary) {
	if p.json {
		out := struct {
			Prefix          string      `json:"prefix"`
			Records         int         `json:"records"`
			Pages           int         `json:"pages"`
			AbandonedListed bool        `json:"abandoned_listed"`
			AbandonedNote   string      `json:"abandoned_note,omitempty"`
			Scopes          []jsonScope `json:"scopes"`
		}{Prefix: prefix, Records: s.Records, Pages: s.Pages, AbandonedListed: s.AbandonedListed, Scopes: []jsonScope{}}
		if !s.AbandonedListed {
			out.AbandonedNote = abandonedNote(store)
		}
		rec := func(r *admin.Record) *jsonRecord {
			if r == nil {
				return nil
			}
			j := p.toJSON(*r)
			return &j
		}
		for _, sc := range s.Scopes {
			j := jsonScope{Scope: sc.Scope, InProgress: sc.InProgress, Completed: sc.Completed, Unreadable: sc.Unreadable,
				OldestInProgress: rec(sc.OldestInProgress), OldestAbandoned: rec(sc.OldestAbandoned)}
			if s.AbandonedListed {
				j.Abandoned = &sc.Abandoned
			}
			out.Scopes = append(out.Scopes, j)
		}
		p.writeJSON(out)
		return
	}
	if len(s.Scopes) > 0 {
		tw := tabwriter.NewWriter(p.w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "SCOPE\tIN PROGRESS\tCOMPLETED\tUNREADABLE\tABANDONED\tOLDEST IN PROGRESS\tOLDEST ABANDONED")
		for _, sc := range s.Scopes {
			abandoned := "-"
			if s.AbandonedListed {
				abandoned = fmt.Sprint(sc.Abandoned)
			}
			oldest := "-"
			if r := sc.OldestInProgress; r != nil {
				oldest = fmt.Sprintf("%s (claimed %s ago, %d claim(s), lease left %s)", r.Key, human(p.now().Sub(r.ClaimedAt)), r.Claims, human(r.Remaining))
			}
			gone := "-"
			if r := sc.OldestAbandoned; r != nil {
				gone = fmt.Sprintf("%s (lease ended %s ago)", r.Key, human(-r.Remaining))
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\t%s\n", printable(sc.Scope), sc.InProgress, sc.Completed, sc.Unreadable, abandoned, oldest, gone)
		}
		_ = tw.Flush()
	}
	fmt.Fprintf(p.w, "%d record(s) in %d scope(s) under prefix %q in %s; %d page(s) read\n", s.Records, len(s.Scopes), prefix, p.about, s.Pages)
	if !s.AbandonedListed {
		fmt.Fprintf(p.w, "abandoned: %s\n", abandonedNote(store))
	}
}

// summaryUsage checks the summary command's flags: a scope or a prefix, or
// -all-scopes to accept counting the whole store; a page size within
// 1..MaxListLimit; a pace not negative.
func summaryUsage(opts options, prefix string, allScopes bool, page int) error {
	switch {
	case allScopes && (opts.scope != "" || prefix != ""):
		return errors.New("-all-scopes counts every scope: drop -scope and -prefix")
	case !allScopes && opts.scope == "" && prefix == "":
		return errors.New("name a -scope (or a -prefix), or pass -all-scopes to count every scope; either way the whole store is read (see the cost in -help)")
	case page < 1 || page > admin.MaxListLimit:
		return fmt.Errorf("-page must be between 1 and %d", admin.MaxListLimit)
	case opts.pace < 0:
		return errors.New("-pace must not be negative")
	}
	return nil
}

// summarize runs the summary command.
func summarize(ctx context.Context, a admin.Interface, prefix, store string, opts admin.SummaryOptions, out *printer, stderr io.Writer) int {
	s, err := admin.Summarize(ctx, a, prefix, opts)
	if err != nil {
		fmt.Fprintf(stderr, "dedupctl: %v\n", err)
		return exitError
	}
	out.summary(prefix, store, s)
	return exitOK
}

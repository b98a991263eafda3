package main

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
)

// printer writes results as text for people or as JSON for programs.
type printer struct {
	w         io.Writer
	json      bool
	retention time.Duration // -retention, 0 when not given
	now       func() time.Time
	about     string // where the store is
}

// jsonRecord is a record in JSON output.
type jsonRecord struct {
	Key         string `json:"key"`
	State       string `json:"state"`
	Fingerprint string `json:"fingerprint,omitempty"`
	ResultSize  int    `json:"result_size"`
	// Created is when the record was created; absent when the store does
	// not keep it.
	Created *time.Time `json:"created,omitempty"`
	// ClaimedAt and CompletedAt are when the record's first claim ran and
	// when it was completed; absent when the record does not keep them.
	ClaimedAt   *time.Time `json:"claimed_at,omitempty"`
	CompletedAt *time.Time `json:"completed_at,omitempty"`
	// CompletedEstimate is now + remaining - retention, for a completed
	// record without CompletedAt or Created, when -retention is given.
	CompletedEstimate *time.Time `json:"completed_estimate,omitempty"`
	// TransportID and MessageID are the first claim's ids (Watermill
	// UUID, Lambda record id or X-Request-Id; the SQS MessageId); Claims
	// how many claims acquired the record (0: not kept); ResponseStatus
	// the HTTP status of an httpdedup record's stored response, where the
	// store keeps it (PostgreSQL, memory).
	TransportID     string `json:"transport_id,omitempty"`
	MessageID       string `json:"message_id,omitempty"`
	Claims          int    `json:"claims,omitempty"`
	ResponseStatus  int    `json:"response_status,omitempty"`
	RemainingMillis int64  `json:"remaining_ms"`
	Problem         string `json:"problem,omitempty"`
}

func (p *printer) toJSON(r admin.Record) jsonRecord {
	j := jsonRecord{Key: r.Key, State: r.State, Fingerprint: r.Fingerprint, ResultSize: r.ResultSize,
		TransportID: r.TransportID, MessageID: r.MessageID, Claims: r.Claims, ResponseStatus: r.ResponseStatus,
		RemainingMillis: r.Remaining.Milliseconds(), Problem: r.Problem}
	utc := func(t time.Time) *time.Time {
		if t.IsZero() {
			return nil
		}
		t = t.UTC()
		return &t
	}
	j.Created, j.ClaimedAt, j.CompletedAt = utc(r.Created), utc(r.ClaimedAt), utc(r.CompletedAt)
	if t, ok := p.completedAt(r); ok {
		j.CompletedEstimate = &t
	}
	return j
}

// completedAt estimates when a completed record was completed, from the
// retention the user says the consumers use: the store set its expiry to
// completion + retention. Only for a record that keeps neither its
// completion time nor its creation time.
func (p *printer) completedAt(r admin.Record) (time.Time, bool) {
	if p.retention <= 0 || r.State != admin.StateCompleted || !r.Created.IsZero() || !r.CompletedAt.IsZero() || r.Remaining > p.retention {
		return time.Time{}, false
	}
	return p.now().Add(r.Remaining - p.retention).UTC().Truncate(time.Millisecond), true
}

// printable returns s as it is when every character prints, else quoted
// (%q): a PostgreSQL fingerprint "\x01sha256:…", a foreign id.
func printable(s string) string {
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return fmt.Sprintf("%q", s)
		}
	}
	return s
}

// orNone is s, printable, or "none".
func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return printable(s)
}

func (p *printer) writeJSON(v any) {
	enc := json.NewEncoder(p.w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// human formats a duration for people: whole seconds, or milliseconds
// below a second, cut rather than rounded (a lease "left" is never
// overstated).
func human(d time.Duration) string {
	if d < time.Second {
		return d.Truncate(time.Millisecond).String()
	}
	return d.Truncate(time.Second).String()
}

func (p *printer) record(r admin.Record) {
	if p.json {
		p.writeJSON(p.toJSON(r))
		return
	}
	tw := tabwriter.NewWriter(p.w, 0, 0, 2, ' ', 0)
	line := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, v) }
	line("key", r.Key)
	line("state", r.State)
	switch r.State {
	case admin.StateInProgress:
		line("lease left", human(r.Remaining)+" (a consumer holds the key; copies are nacked until it completes, releases or the lease ends)")
	case admin.StateCompleted:
		line("retention left", human(r.Remaining)+" (copies are acked without running the handler until then)")
	}
	at := func(t time.Time, note string) string {
		return fmt.Sprintf("%s (%s ago; %s)", t.UTC().Format(time.RFC3339Nano), human(p.now().Sub(t)), note)
	}
	if r.ClaimedAt.IsZero() {
		line("claimed at", "not recorded (a record of an earlier version, or a completed Redis record with OmitProvenance)")
	} else {
		line("claimed at", at(r.ClaimedAt, "the first claim"))
	}
	switch t, ok := p.completedAt(r); {
	case !r.CompletedAt.IsZero():
		line("completed at", at(r.CompletedAt, human(r.CompletedAt.Sub(r.ClaimedAt))+" after the first claim"))
	case ok:
		line("completed", fmt.Sprintf("about %s (%s ago, from -retention %s)", t.Format(time.RFC3339), human(p.now().Sub(t)), p.retention))
	case r.State == admin.StateCompleted && p.retention > 0 && r.Remaining > p.retention && r.Created.IsZero():
		line("completed", fmt.Sprintf("unknown: more than -retention %s is left; the consumers' retention is longer", p.retention))
	}
	if r.Claims > 0 {
		claims := fmt.Sprint(r.Claims)
		if r.Claims > 1 {
			claims += fmt.Sprintf(" (%d more after a failed handler released the key, or a lease ended)", r.Claims-1)
		}
		line("claims", claims)
	}
	if !r.ClaimedAt.IsZero() {
		line("transport id", orNone(r.TransportID)+" (the first claim's: Watermill message UUID, Lambda record id or X-Request-Id)")
		line("message id", orNone(r.MessageID)+" (the first claim's broker message id: SQS MessageId)")
	}
	if !r.Created.IsZero() {
		line("created", at(r.Created, "the claim that holds or last held the key"))
	}
	line("fingerprint", orNone(r.Fingerprint))
	line("result", fmt.Sprintf("%d bytes", r.ResultSize))
	if r.ResponseStatus > 0 {
		line("response status", fmt.Sprintf("%d (the stored HTTP response's)", r.ResponseStatus))
	}
	if r.Problem != "" {
		line("problem", r.Problem)
	}
	_ = tw.Flush()
}

func (p *printer) evicted(key string, was *admin.Record) {
	if p.json {
		out := struct {
			Key     string      `json:"key"`
			Evicted bool        `json:"evicted"`
			Was     *jsonRecord `json:"was,omitempty"`
		}{Key: key, Evicted: true}
		if was != nil {
			j := p.toJSON(*was)
			out.Was = &j
		}
		p.writeJSON(out)
		return
	}
	what := "a record"
	if was != nil {
		what = fmt.Sprintf("a %s record with %s left", strings.ReplaceAll(was.State, "_", " "), human(was.Remaining))
	}
	fmt.Fprintf(p.w, "evicted %s: it was %s.\n", key, what)
	fmt.Fprintln(p.w, "The next delivery of this key runs the handler again; a consumer still holding it loses its claim (claim_lost).")
}

// shorten cuts s to n characters with an ellipsis, for table columns.
func shorten(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

func (p *printer) page(prefix string, records []admin.Record, next string) {
	// Stores list in their own order (SCAN, DynamoDB's hash order); sort
	// the page for people.
	sort.SliceStable(records, func(i, j int) bool { return records[i].Key < records[j].Key })
	if p.json {
		out := struct {
			Records    []jsonRecord `json:"records"`
			NextCursor string       `json:"next_cursor"`
		}{Records: []jsonRecord{}, NextCursor: next}
		for _, r := range records {
			out.Records = append(out.Records, p.toJSON(r))
		}
		p.writeJSON(out)
		return
	}
	if len(records) > 0 {
		tw := tabwriter.NewWriter(p.w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "KEY\tSTATE\tLEFT\tAGE\tCLAIMS\tTRANSPORT ID\tMESSAGE ID\tRESULT\tFINGERPRINT")
		dash := func(s string, n int) string {
			if s == "" {
				return "-"
			}
			return shorten(printable(s), n)
		}
		for _, r := range records {
			age := "-" // since the first claim, or the creation, or the estimated completion
			switch t, ok := p.completedAt(r); {
			case !r.ClaimedAt.IsZero():
				age = human(p.now().Sub(r.ClaimedAt))
			case !r.Created.IsZero():
				age = human(p.now().Sub(r.Created))
			case ok:
				age = "~" + human(p.now().Sub(t))
			}
			claims := "-"
			if r.Claims > 0 {
				claims = fmt.Sprint(r.Claims)
			}
			state := r.State
			if r.Problem != "" {
				state += " (" + shorten(r.Problem, 60) + ")"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d B\t%s\n", r.Key, state, human(r.Remaining), age, claims,
				dash(r.TransportID, 36), dash(r.MessageID, 36), r.ResultSize, dash(r.Fingerprint, 20))
		}
		_ = tw.Flush()
	}
	fmt.Fprintf(p.w, "%d record(s) under prefix %q in %s\n", len(records), prefix, p.about)
	if next != "" {
		fmt.Fprintf(p.w, "more: -cursor %s\n", next)
	}
}

package dedup_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
)

// originStore records the Origin each Claim's context carries.
type originStore struct {
	dedup.Store
	mu   sync.Mutex
	seen []dedup.Origin
	none int // claims whose context carried no Origin
}

func (s *originStore) Claim(ctx context.Context, key, fp string, lease time.Duration) (dedup.ClaimResult, error) {
	o, ok := dedup.OriginFromContext(ctx)
	s.mu.Lock()
	if ok {
		s.seen = append(s.seen, o)
	} else {
		s.none++
	}
	s.mu.Unlock()
	return s.Store.Claim(ctx, key, fp, lease)
}

func (s *originStore) last(t *testing.T) dedup.Origin {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.seen) == 0 {
		t.Fatalf("no claim saw an Origin (%d saw none)", s.none)
	}
	return s.seen[len(s.seen)-1]
}

// TestOriginReachesTheStore: the Watermill middleware gives the store the
// message's UUID and the SQS MessageId (or the first of
// Config.TransportIDs); Engine.Do gives it Call.MessageUUID and MessageID,
// or the Origin of its context; the memory store keeps the first claim's.
func TestOriginReachesTheStore(t *testing.T) {
	mem := memstore.New(nil)
	store := &originStore{Store: mem}
	noop := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	msg := func(uuid, order string, meta ...string) *message.Message {
		m := message.NewMessage(uuid, nil)
		m.Metadata.Set("order_id", order)
		for i := 0; i+1 < len(meta); i += 2 {
			m.Metadata.Set(meta[i], meta[i+1])
		}
		return m
	}
	key := func(m *message.Message) (string, error) { return m.Metadata.Get("order_id"), nil }

	d, err := dedup.New(dedup.Config{Store: store, Key: key, Scope: "charge"})
	if err != nil {
		t.Fatal(err)
	}
	h := d.Middleware(noop)
	if _, err := h(msg("uuid-1", "ORDER-1", "sqs_message_id", "sqs-1")); err != nil {
		t.Fatal(err)
	}
	if got, want := store.last(t), (dedup.Origin{TransportID: "uuid-1", MessageID: "sqs-1"}); got != want {
		t.Fatalf("middleware: store saw %+v, want %+v", got, want)
	}
	if _, err := h(msg("uuid-2", "ORDER-2")); err != nil {
		t.Fatal(err)
	}
	if got, want := store.last(t), (dedup.Origin{TransportID: "uuid-2"}); got != want {
		t.Fatalf("middleware without a broker id: store saw %+v, want %+v", got, want)
	}
	rec, err := mem.Inspect(context.Background(), admin.ScopedKey("charge", "ORDER-1"))
	if err != nil || rec.TransportID != "uuid-1" || rec.MessageID != "sqs-1" || rec.Claims != 1 || rec.ClaimedAt.IsZero() || rec.CompletedAt.IsZero() {
		t.Fatalf("the record of ORDER-1: %+v %v", rec, err)
	}

	d, err = dedup.New(dedup.Config{Store: store, Key: key, Scope: "kafka",
		TransportIDs: func(*message.Message) []string { return []string{"", "3/1042", "x"} }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Middleware(noop)(msg("uuid-3", "ORDER-3")); err != nil {
		t.Fatal(err)
	}
	if got, want := store.last(t), (dedup.Origin{TransportID: "uuid-3", MessageID: "3/1042"}); got != want {
		t.Fatalf("TransportIDs: store saw %+v, want %+v", got, want)
	}

	e, err := dedup.NewEngine(dedup.Config{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	work := func(context.Context) ([]byte, error) { return nil, nil }
	ctxOrigin := dedup.Origin{TransportID: "from-ctx", MessageID: "m"}
	for i, c := range []struct {
		ctx  context.Context
		call dedup.Call
		want dedup.Origin
	}{
		{context.Background(), dedup.Call{MessageUUID: "t", MessageID: "m"}, dedup.Origin{TransportID: "t", MessageID: "m"}},
		{context.Background(), dedup.Call{MessageID: "m"}, dedup.Origin{MessageID: "m"}},
		{dedup.WithOrigin(context.Background(), dedup.Origin{TransportID: ctxOrigin.TransportID, MessageID: ctxOrigin.MessageID}), dedup.Call{}, ctxOrigin},
		{dedup.WithOrigin(context.Background(), dedup.Origin{TransportID: ctxOrigin.TransportID, MessageID: ctxOrigin.MessageID}), dedup.Call{MessageUUID: "u"}, dedup.Origin{TransportID: "u"}},
	} {
		c.call.Scope, c.call.Key = "do", "k"+string(rune('0'+i))
		if _, err := e.Do(c.ctx, c.call, work); err != nil {
			t.Fatal(err)
		}
		if got := store.last(t); got != c.want {
			t.Errorf("Do #%d: store saw %+v, want %+v", i, got, c.want)
		}
	}
	before := store.none
	if _, err := e.Do(context.Background(), dedup.Call{Scope: "do", Key: "none"}, work); err != nil {
		t.Fatal(err)
	}
	if store.none != before+1 {
		t.Errorf("a call without any id: the store saw an Origin %+v", store.last(t))
	}
}

// TestOriginFromContextCleansIDs: ids reach stores as text every store
// keeps: at most 100 bytes (dedup.MaxOriginIDLength), valid UTF-8, no control
// characters.
func TestOriginFromContextCleansIDs(t *testing.T) {
	long := strings.Repeat("é", dedup.MaxOriginIDLength) // twice too long
	for in, want := range map[string]string{
		"0b9f8e3c-4d1a-4e2b-9c3d-5e6f7a8b9c0d": "0b9f8e3c-4d1a-4e2b-9c3d-5e6f7a8b9c0d",
		"a\x00b\nc":                            "a\ufffdb\ufffdc",
		"bad-\xff-utf8":                        "bad-\ufffd-utf8",
		long:                                   long[:dedup.MaxOriginIDLength],
		"x" + long:                             "x" + long[:dedup.MaxOriginIDLength-2],
		"":                                     "",
	} {
		o, ok := dedup.OriginFromContext(dedup.WithOrigin(context.Background(), dedup.Origin{TransportID: in, MessageID: "m"}))
		if !ok || o.TransportID != want || o.MessageID != "m" {
			t.Errorf("%.20q: %q %v, want %q", in, o.TransportID, ok, want)
		}
		if len(o.TransportID) > dedup.MaxOriginIDLength || !utf8.ValidString(o.TransportID) {
			t.Errorf("%.20q: %q is not clean", in, o.TransportID)
		}
	}
	if _, ok := dedup.OriginFromContext(dedup.WithOrigin(context.Background(), dedup.Origin{TransportID: "", MessageID: ""})); ok {
		t.Error("an empty Origin was reported")
	}
	if _, ok := dedup.OriginFromContext(context.Background()); ok {
		t.Error("a context without an Origin reported one")
	}
}

// nopStore acquires every claim without allocating, and reads the
// claim's Origin when read is set.
type nopStore struct {
	read bool
	got  dedup.Origin
}

func (s *nopStore) Claim(ctx context.Context, key, _ string, _ time.Duration) (dedup.ClaimResult, error) {
	if s.read {
		s.got, _ = dedup.OriginFromContext(ctx)
	}
	return dedup.ClaimResult{Outcome: dedup.Acquired, Claim: dedup.Claim{Key: key, Token: "t"}}, nil
}
func (s *nopStore) Complete(context.Context, dedup.Claim, []byte, time.Duration) error { return nil }
func (s *nopStore) Release(context.Context, dedup.Claim) error                         { return nil }
func (s *nopStore) Extend(context.Context, dedup.Claim, time.Duration) error           { return nil }

// TestOriginCostsNoAllocation: a store that reads the Origin of the claim's
// context (Call.MessageUUID, Call.MessageID) makes Engine.Do allocate
// nothing more than one that does not. testing.AllocsPerRun counts every
// goroutine's allocations (a goroutine left by an earlier test, late on a
// loaded machine, once added one): each figure is the least of 5
// measurements.
func TestOriginCostsNoAllocation(t *testing.T) {
	allocs := func(read bool) float64 {
		store := &nopStore{read: read}
		e, err := dedup.NewEngine(dedup.Config{Store: store, DisableHeartbeat: true})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		call := dedup.Call{Scope: "s", Key: "k", MessageUUID: "0b9f8e3c-4d1a-4e2b-9c3d-5e6f7a8b9c0d", MessageID: "sqs-1"}
		work := func(context.Context) ([]byte, error) { return nil, nil }
		n := testing.AllocsPerRun(200, func() {
			if _, err := e.Do(ctx, call, work); err != nil {
				t.Fatal(err)
			}
		})
		if read && store.got != (dedup.Origin{TransportID: call.MessageUUID, MessageID: "sqs-1"}) {
			t.Fatalf("the store read %+v", store.got)
		}
		return n
	}
	without, with := allocs(false), allocs(true)
	for range 4 {
		without, with = min(without, allocs(false)), min(with, allocs(true))
	}
	if with != without {
		t.Fatalf("Engine.Do allocates %v times with a store that reads the Origin, %v without", with, without)
	}
}

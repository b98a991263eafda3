package reliability_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
)

// identity is one (scope, message) whose scoped key must stay its own.
type identity struct {
	scope    string
	key      keyfuncs.Func
	payload  string
	metadata map[string]string
}

// collisionPair is two identities that a naive "scope:key" or
// "tenant:order" concatenation, or a truncated partition key, would merge.
type collisionPair struct {
	name string
	a, b identity
}

func collisionPairs(run string) []collisionPair {
	order := keyfuncs.JSON("order_id")
	tenantOrder := keyfuncs.Join(":", keyfuncs.Metadata("tenant"), keyfuncs.JSON("order_id"))
	body := func(id string) string { return fmt.Sprintf(`{"order_id":%q}`, id) }
	// A business key longer than DynamoDB's verbatim limit, and a crafted
	// key equal to the partition key the store derives from it.
	long := run + "-" + strings.Repeat("L", 600)
	hashed, err := dynamo.PartitionKey(admin.ScopedKey("reports", long))
	if err != nil {
		panic(err)
	}
	crafted := strings.TrimPrefix(hashed, "reports:")
	return []collisionPair{
		{"separator in the scope vs in the key",
			identity{scope: "a:b", key: order, payload: body(run + ":c")},
			identity{scope: "a", key: order, payload: body("b:" + run + ":c")}},
		{"escaped separator in the scope vs a real one",
			identity{scope: "a%3Ab", key: order, payload: body(run)},
			identity{scope: "a:b", key: order, payload: body(run)}},
		{"same key, two handlers",
			identity{scope: "charge-orders", key: order, payload: body(run)},
			identity{scope: "ship-orders", key: order, payload: body(run)}},
		{"tenant with the separator vs order with it",
			identity{scope: "orders", key: tenantOrder, payload: body("2-" + run), metadata: map[string]string{"tenant": "acme:1"}},
			identity{scope: "orders", key: tenantOrder, payload: body("1:2-" + run), metadata: map[string]string{"tenant": "acme"}}},
		{"tenant ending in the escape character",
			identity{scope: "orders", key: tenantOrder, payload: body(":2-" + run), metadata: map[string]string{"tenant": `acme\`}},
			identity{scope: "orders", key: tenantOrder, payload: body(`\:2-` + run), metadata: map[string]string{"tenant": "acme"}}},
		{"long key vs its hashed partition key",
			identity{scope: "reports", key: order, payload: body(long)},
			identity{scope: "reports", key: order, payload: body(crafted)}},
	}
}

// Keys of two scopes (handlers) or two tenants never collide, including
// crafted keys containing the separator or the escape character, or equal
// to the partition key DynamoDB derives from a long key; a stored result is
// only ever replayed to the same scoped key. For each pair, on each store:
// the first identity runs and stores its output (Replay on); the second must
// run its own handler (a collision would make it a duplicate and replay
// the first one's output); redeliveries of each replay their own output.
func TestScopesAndTenantsNeverCollide(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind.name, func(t *testing.T) {
			open, recordState := kind.setup(t)
			store := open()
			run := fmt.Sprint(time.Now().UnixNano())
			for _, pair := range collisionPairs(run) {
				t.Run(pair.name, func(t *testing.T) {
					keys := map[string]bool{}
					deliver := func(id identity) (ran bool, output string) {
						t.Helper()
						d := newDedup(t, dedup.Config{Store: store, Key: id.key, Scope: id.scope, Replay: true})
						msg := message.NewMessage(watermill.NewUUID(), []byte(id.payload))
						for k, v := range id.metadata {
							msg.Metadata.Set(k, v)
						}
						out, err := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
							hc, ok := dedup.HeldClaimFromContext(msg.Context())
							if !ok {
								t.Fatalf("handler called without a claim")
							}
							keys[hc.Claim().Key] = true
							ran = true
							return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte("receipt for "+hc.Claim().Key))}, nil
						})(msg)
						if err != nil {
							t.Fatalf("%s %s: %v", id.scope, id.payload, err)
						}
						if len(out) != 1 {
							t.Fatalf("%d output messages, want 1", len(out))
						}
						return ran, string(out[0].Payload)
					}
					ranA, outA := deliver(pair.a)
					ranB, outB := deliver(pair.b)
					againA, replayA := deliver(pair.a)
					againB, replayB := deliver(pair.b)
					if !ranA || !ranB {
						t.Fatalf("handlers ran: a %v, b %v; a collision made b a duplicate of a", ranA, ranB)
					}
					if againA || againB {
						t.Errorf("a redelivery ran the handler again")
					}
					if outA == outB || replayA != outA || replayB != outB {
						t.Errorf("outputs a %q b %q, replays a %q b %q: a result went to another scoped key", outA, outB, replayA, replayB)
					}
					if len(keys) != 2 {
						t.Errorf("scoped keys %v, want two distinct", keys)
					}
					for k := range keys {
						if s := recordState(k); s != "completed" {
							t.Errorf("record %.60q: %s, want completed", k, s)
						}
					}
				})
			}
		})
	}
}

// With a fingerprint, a message that reuses a scoped key with another
// payload is refused (ErrKeyReuse, permanent) and gets no stored result.
// Without one, the key alone is the identity: whoever can publish a message
// with that key in that scope gets the stored result replayed (README.md).
func TestStoredResultNeedsTheSameFingerprint(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind.name, func(t *testing.T) {
			open, _ := kind.setup(t)
			store := open()
			id := fmt.Sprintf("ORDER-%d", time.Now().UnixNano())
			handler := func(msg *message.Message) ([]*message.Message, error) {
				return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte("card ending 1111 charged"))}, nil
			}
			deliver := func(fingerprint func(*message.Message) (string, error), scope, payload string) ([]*message.Message, error) {
				d := newDedup(t, dedup.Config{Store: store, Key: keyfuncs.JSON("order_id"), Scope: scope, Replay: true, Fingerprint: fingerprint})
				return d.Middleware(handler)(message.NewMessage(watermill.NewUUID(), []byte(payload)))
			}
			original := fmt.Sprintf(`{"order_id":%q,"amount":150}`, id)
			forged := fmt.Sprintf(`{"order_id":%q,"amount":1}`, id)
			if _, err := deliver(keyfuncs.PayloadFingerprint, "fp", original); err != nil {
				t.Fatal(err)
			}
			out, err := deliver(keyfuncs.PayloadFingerprint, "fp", forged)
			if !errors.Is(err, dedup.ErrKeyReuse) || len(out) != 0 {
				t.Errorf("reused key with another payload: %d outputs, %v; want ErrKeyReuse and nothing", len(out), err)
			}
			if _, err := deliver(nil, "nofp", original); err != nil {
				t.Fatal(err)
			}
			out, err = deliver(nil, "nofp", forged)
			if err != nil || len(out) != 1 {
				t.Errorf("without a fingerprint: %d outputs, %v; want the stored result replayed", len(out), err)
			}
		})
	}
}

// FuzzScopedKeyInjective: two different (scope, key) pairs never give the
// same scoped key.
func FuzzScopedKeyInjective(f *testing.F) {
	f.Add("a:b", "c", "a", "b:c")
	f.Add("a%3Ab", "c", "a:b", "c")
	f.Add("%", "", "%25", "")
	f.Add("a%", "3A", "a", "%3A")
	f.Add("", ":", ":", "")
	f.Fuzz(func(t *testing.T, s1, k1, s2, k2 string) {
		if (s1 != s2 || k1 != k2) && admin.ScopedKey(s1, k1) == admin.ScopedKey(s2, k2) {
			t.Fatalf("(%q, %q) and (%q, %q) share the scoped key %q", s1, k1, s2, k2, admin.ScopedKey(s1, k1))
		}
	})
}

// What lands in the store, checked against README.md ("What the store
// holds"). A payload with a card number and an e-mail address, a
// PayloadFingerprint, and a handler whose output names the e-mail address:
//
//   - Redis: one key, prefix + scope + ":" + business key (in clear); its
//     value is 58 to 60 bytes (format, state, 8-byte owner token, 16 bytes
//     of SHA-256 of the fingerprint, who and when: claim time and count,
//     the message's UUID as 16 bytes, completed-at) with Replay off; the
//     payload is not in it. With Replay on, the handler's output messages
//     follow, verbatim.
//   - DynamoDB: one item with pk (the scoped key, in clear), state, token,
//     fingerprint (the hex SHA-256 of the payload), deadline, ttl, who and
//     when, and with Replay on a result attribute holding the output
//     verbatim.
func TestStoreHoldsOnlyWhatTheReadmeSays(t *testing.T) {
	const (
		card  = "4111111111111111"
		email = "jane.doe@example.com"
	)
	payload := []byte(fmt.Sprintf(`{"order_id":"ORDER-77","card":%q,"email":%q}`, card, email))
	handler := func(msg *message.Message) ([]*message.Message, error) {
		return []*message.Message{message.NewMessage("receipt-1", []byte("receipt sent to "+email))}, nil
	}
	for _, v := range []struct{ replay, autoPipeline bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		replay := v.replay
		name := fmt.Sprintf("%s,AutoPipeline=%v", map[bool]string{false: "replay-off", true: "replay-on"}[replay], v.autoPipeline)
		t.Run("redis/"+name, func(t *testing.T) {
			prefix := uniquePrefix("holds")
			admin := newRedisClient(t, redisServer.Addr)
			d := newDedup(t, dedup.Config{Store: newRedisStore(t, admin, prefix, v.autoPipeline), Key: keyfuncs.JSON("order_id"),
				Scope: "charge-orders", Fingerprint: keyfuncs.PayloadFingerprint, Replay: replay, Retention: 48 * time.Hour})
			if _, err := d.Middleware(handler)(message.NewMessage(watermill.NewUUID(), payload)); err != nil {
				t.Fatal(err)
			}
			keys, err := admin.Keys(context.Background(), escapeGlob(prefix)+"*").Result()
			if err != nil {
				t.Fatal(err)
			}
			if want := prefix + "charge-orders:ORDER-77"; len(keys) != 1 || keys[0] != want {
				t.Fatalf("keys %q, want only %q", keys, want)
			}
			v, err := admin.Get(context.Background(), keys[0]).Bytes()
			if err != nil {
				t.Fatal(err)
			}
			ttl := admin.PTTL(context.Background(), keys[0]).Val()
			t.Logf("Redis key %q, value %d bytes %q, TTL %v", keys[0], len(v), v, ttl.Round(time.Minute))
			if bytes.Contains(v, []byte(card)) || bytes.Contains(v, payload) {
				t.Errorf("the payload (or its card number) is stored")
			}
			// Header and 8 token bytes (11), the fingerprint field (18), the
			// provenance (26: the claim's time and count, the message's UUID
			// as 16 bytes), completed-at (3 to 5 bytes below 35 minutes).
			if !replay && (len(v) < 58 || len(v) > 60 || bytes.Contains(v, []byte(email))) {
				t.Errorf("value of %d bytes, want 58 to 60 (header, 8 token bytes, fingerprint, provenance, completed-at) and no e-mail address", len(v))
			}
			if replay && !bytes.Contains(v, []byte("receipt sent to "+email)) {
				t.Errorf("with Replay on, the output message is stored verbatim; it is not in %q", v)
			}
			if ttl <= 47*time.Hour || ttl > 48*time.Hour {
				t.Errorf("TTL %v, want the retention", ttl)
			}
		})
		t.Run("dynamodb/"+name, func(t *testing.T) {
			client := newDynamoClient(dynamoEndpoint)
			store, err := dynamo.New(context.Background(), dynamo.Config{Client: client, Table: dynamoTable, SkipTTL: true})
			if err != nil {
				t.Fatal(err)
			}
			scope := fmt.Sprint("holds-", name, "-", time.Now().UnixNano())
			d := newDedup(t, dedup.Config{Store: store, Key: keyfuncs.JSON("order_id"),
				Scope: scope, Fingerprint: keyfuncs.PayloadFingerprint, Replay: replay})
			if _, err := d.Middleware(handler)(message.NewMessage(watermill.NewUUID(), payload)); err != nil {
				t.Fatal(err)
			}
			out, err := client.GetItem(context.Background(), &dynamodb.GetItemInput{
				TableName:      aws.String(dynamoTable),
				Key:            map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: scope + ":ORDER-77"}},
				ConsistentRead: aws.Bool(true),
			})
			if err != nil || out.Item == nil {
				t.Fatalf("GetItem: %v, item %v", err, out.Item)
			}
			var names []string
			for n, v := range out.Item {
				names = append(names, n)
				raw := fmt.Sprint(v)
				if b, ok := v.(*types.AttributeValueMemberB); ok {
					raw = string(b.Value)
				}
				if strings.Contains(raw, card) {
					t.Errorf("attribute %s holds the card number", n)
				}
				if n != "result" && strings.Contains(raw, email) {
					t.Errorf("attribute %s holds the e-mail address", n)
				}
			}
			sort.Strings(names)
			want := "claimed_at claims completed_at deadline fence fingerprint pk state token transport_id ttl"
			if replay {
				want = "claimed_at claims completed_at deadline fence fingerprint pk result state token transport_id ttl"
			}
			t.Logf("DynamoDB item attributes: %s", strings.Join(names, " "))
			if strings.Join(names, " ") != want {
				t.Errorf("attributes %v, want %s", names, want)
			}
			fp, _ := keyfuncs.PayloadFingerprint(message.NewMessage("x", payload))
			if s, _ := out.Item["fingerprint"].(*types.AttributeValueMemberS); s == nil || s.Value != fp {
				t.Errorf("fingerprint attribute %v, want the payload's SHA-256 %s", out.Item["fingerprint"], fp)
			}
			if replay {
				b, _ := out.Item["result"].(*types.AttributeValueMemberB)
				if b == nil || !bytes.Contains(b.Value, []byte("receipt sent to "+email)) {
					t.Errorf("with Replay on, the result attribute holds the output verbatim; got %v", out.Item["result"])
				}
			}
		})
	}
}

package keyfuncs_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
)

func msg(payload string, md ...string) *message.Message {
	m := message.NewMessage("3f2a1c7e-uuid", []byte(payload))
	for i := 0; i+1 < len(md); i += 2 {
		m.Metadata.Set(md[i], md[i+1])
	}
	return m
}

type keyCase struct {
	name    string
	kf      keyfuncs.Func
	msg     *message.Message
	want    string
	wantErr string // substring of the KeyError reason; "" means success
}

func runKeyCases(t *testing.T, cases []keyCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.kf(tc.msg)
			if tc.wantErr == "" {
				if err != nil || got != tc.want {
					t.Fatalf("got (%q, %v), want %q", got, err, tc.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("got key %q, want an error containing %q", got, tc.wantErr)
			}
			if got != "" {
				t.Fatalf("got key %q together with error %v", got, err)
			}
			if !errors.Is(err, dedup.ErrNoKey) {
				t.Fatalf("error %v does not wrap ErrNoKey", err)
			}
			var ke *dedup.KeyError
			if !errors.As(err, &ke) {
				t.Fatalf("error %T is not a *dedup.KeyError", err)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %q does not say %q", err, tc.wantErr)
			}
			if !strings.Contains(err.Error(), tc.msg.UUID) {
				t.Fatalf("error %q does not name the message UUID", err)
			}
		})
	}
}

func TestJSON(t *testing.T) {
	id := keyfuncs.JSON("order_id")
	nested := keyfuncs.JSON("order.id")
	runKeyCases(t, []keyCase{
		{"string", id, msg(`{"order_id":"ORDER-003","amount":150}`), "ORDER-003", ""},
		{"nested", nested, msg(`{"order":{"id":"ORDER-003"}}`), "ORDER-003", ""},
		{"escapes decoded", id, msg(`{"order_id":"A\u00e9\"B"}`), `Aé"B`, ""},
		{"integer", id, msg(`{"order_id":42}`), "42", ""},
		{"negative integer", id, msg(`{"order_id":-7}`), "-7", ""},
		{"integer beyond float64 precision", id, msg(`{"order_id":12345678901234567890123}`), "12345678901234567890123", ""},
		{"whitespace around value kept", id, msg(`{"order_id":" A "}`), " A ", ""},
		{"fraction", id, msg(`{"order_id":4.2}`), "", "not an integer"},
		{"exponent", id, msg(`{"order_id":1e3}`), "", "not an integer"},
		{"missing", id, msg(`{"other":"x"}`), "", "missing"},
		{"null", id, msg(`{"order_id":null}`), "", "null"},
		{"payload null", id, msg(`null`), "", "missing"},
		{"empty string", id, msg(`{"order_id":""}`), "", "empty"},
		{"blank string", id, msg(`{"order_id":" \t\n"}`), "", "empty"},
		{"boolean", id, msg(`{"order_id":true}`), "", "boolean"},
		{"object", id, msg(`{"order_id":{"x":1}}`), "", "object or array"},
		{"array", id, msg(`{"order_id":[1]}`), "", "object or array"},
		{"not JSON", id, msg(`order_id=ORDER-003`), "", "not valid JSON"},
		{"truncated JSON", id, msg(`{"order_id":"ORDER-003"`), "", "not valid JSON"},
		{"empty payload", id, msg(``), "", "not valid JSON"},
		{"invalid UTF-8", id, msg("{\"order_id\":\"\xff\xfe\"}"), "", "not valid JSON"},
		{"array payload", id, msg(`["ORDER-003"]`), "", "missing"},
	})
}

func TestJSONString(t *testing.T) {
	id := keyfuncs.JSONString("order_id")
	runKeyCases(t, []keyCase{
		{"string", id, msg(`{"order_id":"ORDER-003"}`), "ORDER-003", ""},
		{"string of digits", id, msg(`{"order_id":"42"}`), "42", ""},
		{"integer refused", id, msg(`{"order_id":42}`), "", "a string is expected"},
		{"fraction refused", id, msg(`{"order_id":4.2}`), "", "a string is expected"},
		{"missing", id, msg(`{}`), "", "missing"},
		{"null", id, msg(`{"order_id":null}`), "", "null"},
		{"not JSON", id, msg(`x`), "", "not valid JSON"},
	})
}

func TestMetadata(t *testing.T) {
	kf := keyfuncs.Metadata("order_id")
	runKeyCases(t, []keyCase{
		{"present", kf, msg(`{}`, "order_id", "ORDER-003"), "ORDER-003", ""},
		{"missing", kf, msg(`{}`, "other", "x"), "", "missing"},
		{"empty", kf, msg(`{}`, "order_id", ""), "", "empty"},
		{"blank", kf, msg(`{}`, "order_id", "  "), "", "empty"},
	})
}

func snsEnvelope(inner string) string {
	return `{"Type":"Notification","MessageId":"b1946ac9-sns","TopicArn":"arn:aws:sns:us-east-1:000000000000:orders",` +
		`"Message":` + quote(inner) + `,"Timestamp":"2026-11-30T12:00:00.000Z"}`
}

func quote(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	return `"` + r.Replace(s) + `"`
}

func TestSNSEnvelope(t *testing.T) {
	kf := keyfuncs.SNSEnvelope(keyfuncs.JSON("order_id"))
	runKeyCases(t, []keyCase{
		{"envelope", kf, msg(snsEnvelope(`{"order_id":"ORDER-003"}`)), "ORDER-003", ""},
		{"raw delivery", kf, msg(`{"order_id":"ORDER-003"}`), "ORDER-003", ""},
		{"inner not JSON", kf, msg(snsEnvelope(`ORDER-003`)), "", "not valid JSON"},
		{"inner missing key", kf, msg(snsEnvelope(`{"id":"x"}`)), "", "missing"},
		{"message not a string", kf, msg(`{"Type":"Notification","TopicArn":"arn:x","Message":{"order_id":"A"}}`), "", "without a string Message"},
		{"message missing", kf, msg(`{"Type":"Notification","TopicArn":"arn:x"}`), "", "without a string Message"},
		{"not JSON at all", kf, msg(`garbage`), "", "not valid JSON"},
	})
	// The inner function sees the metadata of the outer message.
	md := keyfuncs.SNSEnvelope(keyfuncs.Metadata("tenant"))
	if k, err := md(msg(snsEnvelope(`{}`), "tenant", "acme")); err != nil || k != "acme" {
		t.Fatalf("metadata through envelope: %q, %v", k, err)
	}
}

func TestCompositions(t *testing.T) {
	tenant := keyfuncs.Metadata("tenant")
	order := keyfuncs.JSON("order_id")
	join := keyfuncs.Join(":", tenant, order)
	runKeyCases(t, []keyCase{
		{"prefix", keyfuncs.Prefix("shop-a/", order), msg(`{"order_id":"1"}`), "shop-a/1", ""},
		{"prefix error passes", keyfuncs.Prefix("shop-a/", order), msg(`{}`), "", "missing"},
		{"join", join, msg(`{"order_id":"1"}`, "tenant", "acme"), "acme:1", ""},
		{"join escapes separator", join, msg(`{"order_id":"b:c"}`, "tenant", "a"), `a:b\:c`, ""},
		{"join escapes backslash", join, msg(`{"order_id":"c"}`, "tenant", `a\`), `a\\:c`, ""},
		{"join missing part", join, msg(`{"order_id":"1"}`), "", "metadata:tenant"},
		{"first of: header", keyfuncs.FirstOf(keyfuncs.Metadata("order_id"), order), msg(`{"order_id":"body"}`, "order_id", "header"), "header", ""},
		{"first of: body", keyfuncs.FirstOf(keyfuncs.Metadata("order_id"), order), msg(`{"order_id":"body"}`), "body", ""},
		{"first of: none", keyfuncs.FirstOf(keyfuncs.Metadata("order_id"), order), msg(`{}`), "", "no alternative"},
	})
	// Join's escaping keeps distinct tuples distinct.
	a, _ := join(msg(`{"order_id":"c"}`, "tenant", "a:b"))
	b, _ := join(msg(`{"order_id":"b:c"}`, "tenant", "a"))
	if a == b {
		t.Fatalf("Join collision: %q", a)
	}
	// FirstOf stops at an error that is not ErrNoKey.
	boom := errors.New("boom")
	failing := func(*message.Message) (string, error) { return "", boom }
	if _, err := keyfuncs.FirstOf(failing, order)(msg(`{"order_id":"1"}`)); !errors.Is(err, boom) {
		t.Fatalf("FirstOf: got %v, want boom", err)
	}
}

func TestJoinRefusesBadSeparator(t *testing.T) {
	for _, sep := range []string{"", `\`, `a\b`, "\xff", ":\xe2\x86"} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Join(%q) did not panic", sep)
				}
			}()
			keyfuncs.Join(sep, keyfuncs.Metadata("a"))
		}()
	}
}

// Issue 14: with a separator of several characters, escaping only whole
// occurrences of sep let a part's last characters and the separator's first
// (or the separator's last and a part's first) read as a separator: ("a:",
// "b") and ("a", ":b") both gave "a:::b" with "::".
func TestJoinMultiCharSeparatorInjective(t *testing.T) {
	for _, tc := range []struct {
		sep        string
		a, b, c, d string
	}{
		{"::", "a:", "b", "a", ":b"},
		{"::", "a::", "b", "a", "::b"},
		{"::", "a:", ":b", "a::", "b"},
		{"--", "x-", "-y", "x", "--y"},
		{"ab", "xa", "by", "x", "aby"},
		{"→|", "x→", "|y", "x", "→||y"},
		{":", "a:", "b", "a", ":b"},
	} {
		kf := keyfuncs.Join(tc.sep, keyfuncs.Metadata("p"), keyfuncs.Metadata("q"))
		k1, err1 := kf(msg(`{}`, "p", tc.a, "q", tc.b))
		k2, err2 := kf(msg(`{}`, "p", tc.c, "q", tc.d))
		if err1 != nil || err2 != nil {
			t.Fatalf("Join(%q): errors %v, %v", tc.sep, err1, err2)
		}
		if k1 == k2 {
			t.Errorf("Join(%q): (%q, %q) and (%q, %q) share the key %q", tc.sep, tc.a, tc.b, tc.c, tc.d, k1)
		}
	}
}

// Issue 14: gjson reads the first of two members with one name, encoding/json
// the last (and, into a struct, matches names ignoring case). A key read
// through a repeated member would be one order to dedup and another to the
// handler, so it is refused as ambiguous, at every level of the path.
func TestJSONRepeatedMember(t *testing.T) {
	id := keyfuncs.JSON("order_id")
	str := keyfuncs.JSONString("order_id")
	nested := keyfuncs.JSON("order.id")
	item := keyfuncs.JSON("items.1.sku")
	runKeyCases(t, []keyCase{
		{"repeated key", id, msg(`{"order_id":"ORDER-B","amount":150,"order_id":"ORDER-A"}`), "", `ambiguous: member "order_id" appears twice`},
		{"repeated key, string", str, msg(`{"order_id":"ORDER-B","order_id":"ORDER-A"}`), "", `ambiguous: member "order_id" appears twice`},
		{"repeated three times", id, msg(`{"order_id":"A","order_id":"B","order_id":"C"}`), "", `appears 3 times`},
		{"repeated with the same value", id, msg(`{"order_id":"A","order_id":"A"}`), "", `ambiguous`},
		{"repeated, second null", id, msg(`{"order_id":"A","order_id":null}`), "", `ambiguous`},
		{"repeated in another case", id, msg(`{"order_id":"A","ORDER_ID":"B"}`), "", `ambiguous: member "order_id" appears twice`},
		{"escaped name repeats", id, msg(`{"order_id":"A","order\u005fid":"B"}`), "", `ambiguous`},
		{"repeated outer object", nested, msg(`{"order":{"id":"A"},"order":{"id":"B"}}`), "", `ambiguous: member "order" appears twice`},
		{"repeated outer, one without the key", nested, msg(`{"order":{"id":"A"},"order":{"x":1}}`), "", `ambiguous: member "order"`},
		{"repeated inner key", nested, msg(`{"order":{"id":"A","id":"B"}}`), "", `ambiguous: member "id" appears twice`},
		{"repeated inside an array element", item, msg(`{"items":[{"sku":"X"},{"sku":"A","sku":"B"}]}`), "", `ambiguous: member "sku"`},
		{"repeated array", item, msg(`{"items":[{},{"sku":"A"}],"items":[{},{"sku":"B"}]}`), "", `ambiguous: member "items"`},
		{"repeats off the path are fine", id, msg(`{"amount":1,"amount":2,"order_id":"A","x":{"order_id":"B"}}`), "A", ""},
		{"repeats in a sibling element are fine", item, msg(`{"items":[{"sku":"X","sku":"Y"},{"sku":"A"}]}`), "A", ""},
	})
}

func TestSNSEnvelopeRepeatedMember(t *testing.T) {
	kf := keyfuncs.SNSEnvelope(keyfuncs.JSON("order_id"))
	twoMessages := `{"Type":"Notification","TopicArn":"arn:x","Message":` + quote(`{"order_id":"ORDER-B"}`) +
		`,"Message":` + quote(`{"order_id":"ORDER-A"}`) + `}`
	twoTypes := `{"Type":"Notification","TopicArn":"arn:x","Message":` + quote(`{"order_id":"ORDER-B"}`) +
		`,"Type":"Raw","order_id":"ORDER-A"}`
	runKeyCases(t, []keyCase{
		{"repeated Message", kf, msg(twoMessages), "", `ambiguous: member "Message" appears twice`},
		{"repeated Type", kf, msg(twoTypes), "", `ambiguous: member "Type" appears twice`},
		{"Message in another case", kf, msg(`{"Type":"Notification","TopicArn":"arn:x","Message":"{}","message":"{\"order_id\":\"A\"}"}`), "", `ambiguous: member "Message"`},
		{"repeated key inside Message", kf, msg(snsEnvelope(`{"order_id":"ORDER-B","order_id":"ORDER-A"}`)), "", `ambiguous: member "order_id" appears twice`},
		{"repeated key, raw delivery", kf, msg(`{"order_id":"ORDER-B","order_id":"ORDER-A"}`), "", `ambiguous: member "order_id" appears twice`},
		{"other envelope members may repeat", kf, msg(`{"Type":"Notification","TopicArn":"arn:x","Timestamp":"1","Timestamp":"2","Message":` + quote(`{"order_id":"A"}`) + `}`), "A", ""},
	})
}

func TestJSONPathSyntax(t *testing.T) {
	runKeyCases(t, []keyCase{
		{"escaped dot", keyfuncs.JSON(`a\.b`), msg(`{"a.b":"X","a":{"b":"Y"}}`), "X", ""},
		{"dot", keyfuncs.JSON(`a.b`), msg(`{"a.b":"X","a":{"b":"Y"}}`), "Y", ""},
		{"escaped wildcard", keyfuncs.JSON(`order\*`), msg(`{"order_id":"X","order*":"Y"}`), "Y", ""},
		{"punctuation", keyfuncs.JSON(`x-y:z/w`), msg(`{"x-y:z/w":"X"}`), "X", ""},
		{"digits name a member", keyfuncs.JSON(`m.0`), msg(`{"m":{"0":"X"}}`), "X", ""},
		{"digits index an array", keyfuncs.JSON(`m.1`), msg(`{"m":["X","Y"]}`), "Y", ""},
		{"index past the end", keyfuncs.JSON(`m.2`), msg(`{"m":["X","Y"]}`), "", "missing"},
		{"name into an array", keyfuncs.JSON(`m.x`), msg(`{"m":["X","Y"]}`), "", "missing"},
		{"name into a string", keyfuncs.JSON(`m.x`), msg(`{"m":"X"}`), "", "missing"},
		{"name in another case is not the member", keyfuncs.JSON(`order_id`), msg(`{"ORDER_ID":"X"}`), "", "missing"},
	})
	for _, path := range []string{"", ".", "a..b", "a.", `a\`, "order_*", "order_i?", "items.#", "items.#.sku", "a|b", "@this", "a.@reverse", "!true", "[a,b]", "{a}"} {
		for name, fn := range map[string]func(string) keyfuncs.Func{"JSON": keyfuncs.JSON, "JSONString": keyfuncs.JSONString} {
			func() {
				defer func() {
					if recover() == nil {
						t.Errorf("%s(%q) did not panic", name, path)
					}
				}()
				fn(path)
			}()
		}
	}
}

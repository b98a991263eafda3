package powertools_test

import (
	"crypto/md5"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/lambdadedup/powertools"
)

// Python's keys, checked against the source of aws-lambda-powertools
// (BasePersistenceLayer._generate_hash: the hex MD5 of json.dumps(data,
// cls=Encoder, sort_keys=True)) rather than run: each case gives the text
// json.dumps writes for the selection, as its documentation and CPython's
// json encoder define it (", " and ": " separators, ensure_ascii, floats
// by repr, integers exact), and the key must be its hash.
func TestPythonKeys(t *testing.T) {
	cases := []struct {
		name, event, path, dumps string
	}{
		{"string", `{"order_id":"ORDER-003"}`, "order_id", `"ORDER-003"`},
		{"integer", `{"order_id":42}`, "order_id", `42`},
		{"object, keys by code point", `{"c":{"zip":"75001","City":"Paris","a":[1,"x"]}}`, "c", `{"City": "Paris", "a": [1, "x"], "zip": "75001"}`},
		{"unicode escaped", `{"n":"注文 🚀 café"}`, "n", `"\u6ce8\u6587 \ud83d\ude80 caf\u00e9"`},
		{"controls and DEL", `{"s":"a\u0001\u007f\n\t\"\\/"}`, "s", `"a\u0001\u007f\n\t\"\\/"`},
		{"numbers", `{"f":0.1,"g":1.0,"h":1e16,"i":1e-05,"j":123456789012345678901234567890,"k":-0,"l":1.5e300,"m":0.0001,"n":2.5E+3,"o":1234567890123456.0,"p":-0.0}`, "",
			`{"f": 0.1, "g": 1.0, "h": 1e+16, "i": 1e-05, "j": 123456789012345678901234567890, "k": 0, "l": 1.5e+300, "m": 0.0001, "n": 2500.0, "o": 1234567890123456.0, "p": -0.0}`},
		{"out of range", `{"x":1e400}`, "x", `Infinity`},
		{"array", `{"a":[1,"a",null,true,{}]}`, "a", `[1, "a", null, true, {}]`},
		{"body", `{"body":"{\"order_id\": \"O-1\", \"n\": 7}"}`, "powertools_json(body)", `{"n": 7, "order_id": "O-1"}`},
		{"zero is a key", `{"k":0}`, "k", `0`},
		{"false is a key", `{"k":false}`, "k", `false`},
		{"length counts", `{"a":[1,2,3]}`, "length(a)", `3`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			keys, err := powertools.New(powertools.Config{Runtime: powertools.Python, Prefix: "fn.app.handler", EventKeyJMESPath: c.path})
			if err != nil {
				t.Fatal(err)
			}
			got, err := keys.IdempotencyKey([]byte(c.event))
			if err != nil {
				t.Fatal(err)
			}
			sum := md5.Sum([]byte(c.dumps))
			if want := "fn.app.handler#" + hex.EncodeToString(sum[:]); got != want {
				t.Fatalf("key %s, want %s (the hash of %s)", got, want, c.dumps)
			}
		})
	}
}

// Python's is_missing_idempotency_key: an empty string, object or array,
// or an array of nulls, is no key (Python runs such an event without
// idempotency; dedup refuses it).
func TestPythonMissingKeys(t *testing.T) {
	for _, event := range []string{`{"k":""}`, `{"k":{}}`, `{"k":[]}`, `{"k":[null,null]}`, `{"k":null}`, `{}`} {
		keys, err := powertools.New(powertools.Config{Runtime: powertools.Python, EventKeyJMESPath: "k"})
		if err != nil {
			t.Fatal(err)
		}
		if got, err := keys.IdempotencyKey([]byte(event)); !errors.Is(err, dedup.ErrNoKey) {
			t.Errorf("%s: %q, %v; want ErrNoKey", event, got, err)
		}
	}
}

// What go-jmespath would decide otherwise than Python's jmespath on exact
// numbers is refused at New, and so is a Powertools function where it
// cannot be called.
func TestUnsupportedExpressions(t *testing.T) {
	cases := []struct {
		rt   powertools.Runtime
		expr string
	}{
		{powertools.Python, "items[?q > `2`].id"},
		{powertools.Python, "max(items[*].q)"},
		{powertools.Python, "items[?q == `2`]"},
		{powertools.TypeScript, "[powertools_json(body).a, powertools_json(body).b]"},
		{powertools.TypeScript, "powertools_json(body).a || b"},
		{powertools.TypeScript, "Records[*].powertools_json(body)"},
		{powertools.TypeScript, "powertools_json(body"},
	}
	for _, c := range cases {
		if _, err := powertools.New(powertools.Config{Runtime: c.rt, EventKeyJMESPath: c.expr}); err == nil {
			t.Errorf("%v %q: accepted", c.rt, c.expr)
		}
	}
	if _, err := powertools.New(powertools.Config{EventKeyJMESPath: "a"}); err == nil {
		t.Error("no Runtime: accepted")
	}
	if _, err := powertools.New(powertools.Config{Runtime: powertools.TypeScript, HashFunction: "crc32"}); err == nil {
		t.Error("HashFunction crc32: accepted")
	}
}

package powertools_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/lambdadedup/powertools"
)

// fixtureCase is a case of testdata/cases.json, the input of
// testdata/keys.cjs.
type fixtureCase struct {
	Name                      string `json:"name"`
	Event                     string `json:"event"`
	EventKeyJMESPath          string `json:"eventKeyJmesPath"`
	PayloadValidationJMESPath string `json:"payloadValidationJmesPath,omitempty"`
	HashFunction              string `json:"hashFunction,omitempty"`
	KeyPrefix                 string `json:"keyPrefix"`
	// Differs says why Go cannot agree with Powertools on this case.
	Differs string `json:"differs,omitempty"`
}

// fixtureAnswer is Powertools' answer for a case (testdata/typescript.json).
type fixtureAnswer struct {
	Name       string  `json:"name"`
	Key        *string `json:"key"`
	Validation string  `json:"validation"`
	Missing    bool    `json:"missing"`
	Error      string  `json:"error,omitempty"`
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// checkTypeScript compares the Go keys of every case with answers
// computed by @aws-lambda-powertools/idempotency: equal keys and
// validation hashes, ErrNoKey where Powertools runs the event without
// idempotency (a null selection) or under a key shared by every such
// event (a missing one), and a difference exactly where the case says
// why.
func checkTypeScript(t *testing.T, cases []fixtureCase, answers []fixtureAnswer) {
	t.Helper()
	if len(answers) != len(cases) {
		t.Fatalf("%d answers for %d cases", len(answers), len(cases))
	}
	for i, c := range cases {
		a := answers[i]
		t.Run(c.Name, func(t *testing.T) {
			if a.Name != c.Name || a.Error != "" {
				t.Fatalf("answer %+v for case %q", a, c.Name)
			}
			keys, err := powertools.New(powertools.Config{Runtime: powertools.TypeScript, Prefix: c.KeyPrefix,
				EventKeyJMESPath: c.EventKeyJMESPath, PayloadValidationJMESPath: c.PayloadValidationJMESPath, HashFunction: c.HashFunction})
			if err != nil {
				t.Fatal(err)
			}
			got, err := keys.IdempotencyKey([]byte(c.Event))
			if a.Key == nil || a.Missing {
				if !errors.Is(err, dedup.ErrNoKey) {
					t.Fatalf("Powertools makes no key or a junk one (%v, missing %v); Go: %q, %v; want ErrNoKey", a.Key, a.Missing, got, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Differs != "" {
				if got == *a.Key {
					t.Fatalf("the keys agree (%s), but the case says they cannot: %s", got, c.Differs)
				}
				t.Logf("differs, as documented: %s", c.Differs)
				return
			}
			if got != *a.Key {
				t.Fatalf("key %s, Powertools %s", got, *a.Key)
			}
			msg := message.NewMessage("uuid-1", []byte(c.Event))
			fp, err := keys.Fingerprint(msg)
			if err != nil || fp != a.Validation {
				t.Fatalf("Fingerprint = %q, %v; Powertools' validation %q", fp, err, a.Validation)
			}
		})
	}
}

// The committed answers of the real TypeScript package
// (testdata/typescript.json, made by testdata/keys.cjs).
func TestTypeScriptFixtures(t *testing.T) {
	var cases []fixtureCase
	var answers []fixtureAnswer
	readJSON(t, "testdata/cases.json", &cases)
	readJSON(t, "testdata/typescript.json", &answers)
	checkTypeScript(t, cases, answers)
}

// toolsDir is the repository's tools/node_modules, where `npm ci --prefix
// tools` (make test) installs @aws-lambda-powertools/idempotency; "" when
// it is not there.
func toolsDir(t *testing.T) string {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		nm := filepath.Join(dir, "tools", "node_modules")
		if _, err := os.Stat(filepath.Join(nm, "@aws-lambda-powertools", "idempotency", "package.json")); err == nil {
			return nm
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

// The answers again, from the TypeScript package itself run by Node:
// the committed file must be what the pinned package computes, and Go must
// agree with it. Skipped without Node or tools/node_modules (make test
// installs both).
func TestTypeScriptFixturesFresh(t *testing.T) {
	nm := toolsDir(t)
	node, err := exec.LookPath("node")
	if nm == "" || err != nil {
		t.Skip("node or tools/node_modules/@aws-lambda-powertools/idempotency is missing: run `npm ci --prefix tools` (make test does)")
	}
	in, err := os.ReadFile("testdata/cases.json")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(node, "testdata/keys.cjs")
	cmd.Env = append(os.Environ(), "NODE_PATH="+nm, "NODE_NO_WARNINGS=1")
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node keys.cjs: %v\n%s", err, stderr.String())
	}
	committed, err := os.ReadFile("testdata/typescript.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out, committed) {
		t.Errorf("testdata/typescript.json is not what the pinned package computes: regenerate it with\n  NODE_PATH=tools/node_modules node lambdadedup/powertools/testdata/keys.cjs < lambdadedup/powertools/testdata/cases.json > lambdadedup/powertools/testdata/typescript.json")
	}
	var cases []fixtureCase
	var answers []fixtureAnswer
	if err := json.Unmarshal(in, &cases); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(out, &answers); err != nil {
		t.Fatal(err)
	}
	checkTypeScript(t, cases, answers)
}

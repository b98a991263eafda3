package dynamo_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
)

func TestPartitionKey(t *testing.T) {
	verbatim := []string{"k", "charge:ORDER-003", "注文-003-🚀", strings.Repeat("x", dynamo.MaxVerbatimKeyBytes)}
	for _, k := range verbatim {
		if pk, err := dynamo.PartitionKey(k); err != nil || pk != k {
			t.Errorf("PartitionKey(%.20q…) = %.20q…, %v; want the key itself", k, pk, err)
		}
	}

	long := strings.Repeat("x", 10*1024)
	hashed := []string{
		strings.Repeat("x", dynamo.MaxVerbatimKeyBytes+1),
		long + "a", long + "b", "a" + long,
		strings.Repeat("é", 3000), // 2-byte runes: the cut falls on a boundary
		strings.Repeat("€", 1000), // 3-byte runes: the cut moves back to 510 bytes
		strings.Repeat("🚀", 1000), // 4-byte runes
	}
	seen := map[string]string{}
	for _, k := range hashed {
		pk, err := dynamo.PartitionKey(k)
		if err != nil {
			t.Fatalf("PartitionKey(%.20q…): %v", k, err)
		}
		prefix, digest, ok := strings.Cut(pk, "…#sha256:")
		if !ok || len(digest) != 64 || !strings.HasPrefix(k, prefix) || !utf8.ValidString(pk) {
			t.Errorf("PartitionKey(%.20q…) = %.40q…: want <prefix of the key>…#sha256:<64 hex>", k, pk)
		}
		// Longer than any verbatim key, so the forms cannot collide, and
		// well within DynamoDB's 2048 bytes.
		if len(pk) <= dynamo.MaxVerbatimKeyBytes || len(pk) > 587 || len(prefix) < dynamo.MaxVerbatimKeyBytes-3 {
			t.Errorf("PartitionKey(%.20q…) is %d bytes with a %d-byte prefix", k, len(pk), len(prefix))
		}
		if other, dup := seen[pk]; dup {
			t.Errorf("keys %.20q… and %.20q… share the partition key %q", k, other, pk)
		}
		seen[pk] = k
		if again, _ := dynamo.PartitionKey(k); again != pk {
			t.Errorf("PartitionKey is not deterministic")
		}
	}

	for _, bad := range []string{"", "\xff", "ok-then-\xc3"} {
		if _, err := dynamo.PartitionKey(bad); !errors.Is(err, dynamo.ErrInvalidKey) {
			t.Errorf("PartitionKey(%q) = %v, want ErrInvalidKey", bad, err)
		}
	}
}

func ExamplePartitionKey() {
	short, _ := dynamo.PartitionKey("charge:ORDER-003")
	fmt.Println(short)

	long, _ := dynamo.PartitionKey("charge:" + strings.Repeat("A", 600))
	fmt.Println(len(long), long[500:])
	// Output:
	// charge:ORDER-003
	// 587 AAAAAAAAAAAA…#sha256:ff07d569ea661caca289d75bf171decee211c30ad363bcf37c7bac9f7eb364e1
}

// The table has no prefix: the partition key is the scoped key, or its
// hashed form beyond MaxVerbatimKeyBytes. Two different keys never get the
// same partition key (a hashed one is longer than any verbatim one).
func FuzzPartitionKeyInjective(f *testing.F) {
	long := strings.Repeat("x", dynamo.MaxVerbatimKeyBytes)
	f.Add(long, long+"y")
	f.Add(long+"a", long+"b")
	f.Add("billing:charge:ORDER-1", "billing%3Acharge:ORDER-1")
	f.Fuzz(func(t *testing.T, a, b string) {
		pa, errA := dynamo.PartitionKey(a)
		pb, errB := dynamo.PartitionKey(b)
		if errA != nil || errB != nil || a == b {
			return
		}
		if pa == pb {
			t.Fatalf("keys %.80q and %.80q share the partition key %.80q", a, b, pa)
		}
	})
}

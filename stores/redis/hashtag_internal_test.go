package redis

import (
	"strings"
	"testing"

	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
)

// trickyRecordKeys returns Redis keys of records (prefix + scope + ":" +
// business key) with "{" and "}" in the prefix, the scope and the key, in
// every position: tags that close early, empty tags, braces without a
// partner, tags of the business key behind braces of the prefix.
func trickyRecordKeys() []string {
	prefixes := []string{"dedup:", "{dedup}:", "{:", "}:", "}{:", "{}:", "a{b}c:", "x}{y}:"}
	scopes := []string{"tx", "{s}", "s}", "{", "}", "a:b"}
	keys := []string{
		"order-1", "{account-7}:payment-9", "a}b", "{x}y", "}", "{", "}{", "{}", "{}x", "x{}",
		"{{", "}}", "a{b", "a}b{c", "{a}b{c}", "{}{x}", "{{x}}", "x}y{z}", "{}}", "é}ü", "{é}", " {} ", "a{}b}c",
	}
	var out []string
	for _, p := range prefixes {
		for _, s := range scopes {
			for _, k := range keys {
				out = append(out, p+admin.ScopedKey(s, k))
			}
		}
	}
	return out
}

// A key that begins with Tx.HashTag is in the record's slot, whatever
// follows the tag and whatever braces the record's key holds; where the
// record's key has a hash tag, or no "}", the tag is the one it always was.
func TestHashTagSlot(t *testing.T) {
	for _, record := range trickyRecordKeys() {
		tag := (&Tx{recordKey: record}).HashTag()
		if !strings.HasPrefix(tag, "{") || !strings.HasSuffix(tag, "}") || len(tag) < 3 {
			t.Errorf("HashTag of %q = %q; want a non-empty {tag}", record, tag)
			continue
		}
		for _, suffix := range []string{"", ":charge", "}", "{z}", ":{a}b", "{}"} {
			if got, want := keySlot(tag+suffix), keySlot(record); got != want {
				t.Errorf("record %q: HashTag %q + %q is in slot %d; the record in slot %d", record, tag, suffix, got, want)
			}
		}
		if own := hashTagOf(record); !strings.Contains(own, "}") && tag != "{"+own+"}" {
			t.Errorf("HashTag of %q = %q; want {%s}, as before", record, tag, own)
		}
	}
}

// Every slot has a tag of digits and lower-case letters that hashes to it,
// and the first of them is stable: the keys users build from it must not
// move.
func TestSlotTags(t *testing.T) {
	for slot, tag := range slotTags() {
		if tag == "" || len(tag) > 4 || strings.Trim(tag, "0123456789abcdefghijklmnopqrstuvwxyz") != "" {
			t.Fatalf("slot %d: tag %q; want 1 to 4 digits and lower-case letters", slot, tag)
		}
		if got := keySlot("{" + tag + "}:x"); got != slot {
			t.Fatalf("slot %d: tag %q hashes to slot %d", slot, tag, got)
		}
	}
	if got := slotHashTag("dedup:tx:a}b"); got != "{"+slotTags()[16129]+"}" || keySlot("dedup:tx:a}b") != 16129 {
		t.Fatalf(`slotHashTag("dedup:tx:a}b") = %q; want the tag of slot 16129`, got)
	}
}

package redis

import "testing"

// keySlot against Redis Cluster's documented values: CRC-16/XMODEM's check
// value, the slot of "foo", and hash tags (TestRunInTxCluster checks the
// slots of real keys with CLUSTER KEYSLOT).
func TestKeySlot(t *testing.T) {
	if got := crc16("123456789"); got != 0x31c3 {
		t.Fatalf("crc16 = %#x; want 0x31c3", got)
	}
	for key, want := range map[string]int{
		"foo":                  12182,
		"{user1000}.following": keySlot("user1000"),
		"{}x":                  keySlot("{}x"),
		"a{b}c{d}":             keySlot("b"),
		"{{x}}":                keySlot("{x"),
	} {
		if got := keySlot(key); got != want {
			t.Errorf("keySlot(%q) = %d; want %d", key, got, want)
		}
	}
	if hashTagOf("{}x") != "{}x" {
		t.Errorf("an empty hash tag hashes the whole key")
	}
}

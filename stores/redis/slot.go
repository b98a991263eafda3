package redis

import (
	"strconv"
	"strings"
	"sync"
)

// hashTagOf returns the part of key a Redis Cluster hashes to a slot: the
// text between the first "{" and the next "}" when it is not empty, else
// the whole key.
func hashTagOf(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i+1 : i+1+j]
		}
	}
	return key
}

// slotHashTag returns a hash tag, "{...}", that puts every key beginning
// with it in key's slot. It is key's own hash tag when key has one, else
// key itself in braces when that closes where it should (key holds no
// "}"), else the tag slotTags chose for the slot.
func slotHashTag(key string) string {
	if tag := hashTagOf(key); tag != "" && strings.IndexByte(tag, '}') < 0 {
		return "{" + tag + "}"
	}
	return "{" + slotTags()[keySlot(key)] + "}"
}

// slotTags gives each slot the first number, in base 36 (0, 1, ..., z,
// 10, ...), that Redis Cluster hashes to it: a tag of at most four digits
// and lower-case letters, for a key whose text cannot be a tag. Built on
// first use (about 88,000 checksums: milliseconds). Keys users build with
// HashTag depend on the order: changing it moves their data.
var slotTags = sync.OnceValue(func() *[16384]string {
	var tags [16384]string
	var buf [8]byte
	for i, left := int64(0), len(tags); left > 0; i++ {
		b := strconv.AppendInt(buf[:0], i, 36)
		if slot := crc16(string(b)) % 16384; tags[slot] == "" {
			tags[slot] = string(b)
			left--
		}
	}
	return &tags
})

// keySlot is the Redis Cluster slot of key: CRC16 (XMODEM) of its hash tag,
// modulo 16384.
func keySlot(key string) int {
	return int(crc16(hashTagOf(key)) % 16384)
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial 0), the checksum of
// Redis Cluster's key slots.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

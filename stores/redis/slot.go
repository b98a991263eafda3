package redis

import "strings"

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

package redis

import (
	goredis "github.com/redis/go-redis/v9"
)

// Script replies. The scripts return a small integer; the store maps it to an
// error with errors.Is-able causes.
const (
	replyOK               = 0
	replyExpired          = 1 // no record
	replyNotOwner         = 2 // another token
	replyAlreadyCompleted = 3 // this token, but completed
	replyUnknownFormat    = 4 // not a format version 1 record
)

// ownedPrelude is shared by the three scripts: it reads the record under
// KEYS[1] and returns early unless it is a version 1 in_progress record whose
// token (bytes 3..18, Lua indexes from 1) equals ARGV[1], the raw 16-byte
// token. It compares byte slices with string.sub: no decoding, binary-safe.
const ownedPrelude = `
local v = redis.call('GET', KEYS[1])
if not v then return 1 end
if string.byte(v, 1) ~= 1 or string.len(v) < 19 then return 4 end
if string.sub(v, 3, 18) ~= ARGV[1] then return 2 end
if string.sub(v, 2, 2) ~= 'P' then return 3 end
`

// completeScript is compare-and-set: KEYS[1] the record, ARGV[1] the raw
// token, ARGV[2] the retention in milliseconds, ARGV[3] the result. It keeps
// the header, token and fingerprint, turns the state to 'C', appends the
// result and sets the retention as the key's TTL (PX): the completed record
// expires on the server's clock.
var completeScript = goredis.NewScript(ownedPrelude + `
local fpEnd = 19 + string.byte(v, 19)
redis.call('SET', KEYS[1], string.sub(v, 1, 1) .. 'C' .. string.sub(v, 3, fpEnd) .. ARGV[3], 'PX', ARGV[2])
return 0
`)

// releaseScript is compare-and-delete: KEYS[1] the record, ARGV[1] the raw
// token.
var releaseScript = goredis.NewScript(ownedPrelude + `
redis.call('DEL', KEYS[1])
return 0
`)

// extendScript is compare-and-pexpire: KEYS[1] the record, ARGV[1] the raw
// token, ARGV[2] the new lease in milliseconds, counted from now on the
// server's clock.
var extendScript = goredis.NewScript(ownedPrelude + `
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 0
`)

package redis

// Script replies. The scripts return a small integer; the store maps it to an
// error with errors.Is-able causes.
const (
	replyOK               = 0
	replyExpired          = 1 // no record
	replyNotOwner         = 2 // another token
	replyAlreadyCompleted = 3 // this token, but completed
	replyUnknownFormat    = 4 // not a record of a known format
)

// ownedPrelude is shared by the token-checking scripts: it reads the record
// under KEYS[1] and returns early unless it is an in_progress record (format
// 1 or 2) whose token (bytes 3..18, Lua indexes from 1) equals ARGV[1], the
// raw 16-byte token. ARGV[2] is the claim's compact completed record (see
// record.go), which, like the first 8 bytes of the token in a version 2
// completed record, tells this claim's completed record from another's. It
// compares byte slices with string.sub: no decoding, binary-safe. On the
// way on, v is the record and f its format byte.
const ownedPrelude = `
local v = redis.call('GET', KEYS[1])
if not v then return 1 end
local f = string.byte(v, 1) or 0
local s = string.sub(v, 2, 2)
if f == 2 and s == 'C' and string.len(v) >= 11 then
  if string.sub(v, 3, 10) == string.sub(ARGV[1], 1, 8) then return 3 end
  return 2
elseif (f == 1 or f == 2) and string.len(v) >= 19 and (s == 'P' or s == 'C') then
  if string.sub(v, 3, 18) ~= ARGV[1] then return 2 end
  if s ~= 'P' then return 3 end
elseif f >= 48 and f <= 57 then
  if v == ARGV[2] then return 3 end
  return 2
else
  return 4
end
`

// completeSrc is compare-and-set: KEYS[1] the record, ARGV[1] the raw
// token, ARGV[2] the compact completed record, ARGV[3] the retention in
// milliseconds, ARGV[4] the result. A record without fields and a result
// becomes ARGV[2] (the compact form); otherwise a version 2 completed record
// keeping the first 8 token bytes and every field of the in-progress record
// (a version 1 fingerprint becomes field 1), followed by the result. The
// retention becomes the key's TTL (PX): the completed record expires on the
// server's clock.
const completeSrc = ownedPrelude + `
local n = string.byte(v, 19)
local fields = string.sub(v, 20, 19 + n)
if f == 1 and n > 0 then fields = '\1' .. string.char(n) .. fields end
if fields == '' and ARGV[4] == '' then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
else
  redis.call('SET', KEYS[1], '\2C' .. string.sub(v, 3, 10) .. string.char(string.len(fields)) .. fields .. ARGV[4], 'PX', ARGV[3])
end
return 0
`

// releaseSrc is compare-and-delete: KEYS[1] the record, ARGV[1] the raw
// token, ARGV[2] the compact completed record.
const releaseSrc = ownedPrelude + `
redis.call('DEL', KEYS[1])
return 0
`

// extendSrc is compare-and-pexpire: KEYS[1] the record, ARGV[1] the raw
// token, ARGV[2] the compact completed record, ARGV[3] the new lease in
// milliseconds, counted from now on the server's clock.
const extendSrc = ownedPrelude + `
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 0
`

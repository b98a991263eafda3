package redis

// Script replies. The scripts return a small integer; the store maps it to an
// error with errors.Is-able causes.
const (
	replyOK               = 0
	replyExpired          = 1 // no record
	replyNotOwner         = 2 // another token
	replyAlreadyCompleted = 3 // this token, but completed
	replyUnknownFormat    = 4 // not a record of a known format
	replyNotAsClaimed     = 5 // completeAsClaimedSrc: not the record expected
)

// ownedPrelude is shared by the token-checking scripts: it reads the record
// under KEYS[1] and returns early unless it is an in_progress record (format
// 1 or 2) whose token (bytes 3..18, Lua indexes from 1) equals ARGV[1], the
// raw 16-byte token. A released record counts as none (reply 1). ARGV[2] is the claim's compact completed record (see
// record.go), which, like the first 8 bytes of the token in a version 2
// completed record, tells this claim's completed record from another's. It
// compares byte slices with string.sub: no decoding, binary-safe. On the
// way on, v is the record and f its format byte.
const ownedPrelude = `
local v = redis.call('GET', KEYS[1])
if not v then return 1 end
local f = string.byte(v, 1) or 0
local s = string.sub(v, 2, 2)
if f == 2 and s == 'R' then return 1 end
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
// milliseconds, ARGV[4] the result, ARGV[5] the time of completion in Unix
// milliseconds, ARGV[6] "1" to leave the provenance out
// (Config.OmitProvenance), ARGV[7] and ARGV[8] the completed record as
// the client built it (appendCompleted, without the result) from the
// in-progress record it expects, or empty. When the record is ARGV[8], it
// becomes ARGV[7] followed by the result. Otherwise the script builds it:
// a record without fields and a result becomes ARGV[2] (the compact form);
// otherwise a version 2 completed record keeping the first 8 token bytes
// and every field of the in-progress record (a version 1 fingerprint
// becomes field 1) but the fence (field 4) and the provenance when left
// out, plus field 3
// (completed-at, after the provenance's claimed-at), followed by the
// result. Both ways write the same bytes (TestCompletedBuiltByClient).
// The retention becomes the key's TTL (PX): the completed record expires
// on the server's clock.
const completeSrc = ownedPrelude + `
if v == ARGV[8] then
  redis.call('SET', KEYS[1], ARGV[7] .. ARGV[4], 'PX', ARGV[3])
` + announce + `
  return 0
end
local n = string.byte(v, 19)
local fields = string.sub(v, 20, 19 + n)
if f == 1 and n > 0 then fields = '\1' .. string.char(n) .. fields end
if f == 2 then
  local kept, i, at = '', 1, nil
  while i + 1 <= string.len(fields) do
    local t, l = string.byte(fields, i, i + 1)
    if t == 4 then
    elseif t ~= 2 then
      kept = kept .. string.sub(fields, i, i + 1 + l)
    elseif ARGV[6] ~= '1' then
      kept = kept .. string.sub(fields, i, i + 1 + l)
      if l >= 6 then
        at = 0
        for k = i + 2, i + 7 do at = at * 256 + string.byte(fields, k) end
      end
    end
    i = i + 2 + l
  end
  fields = kept
  if at then
    local d = math.max(tonumber(ARGV[5]) - at, 0)
    local u = ''
    while d >= 128 do
      u = u .. string.char(d % 128 + 128)
      d = math.floor(d / 128)
    end
    u = u .. string.char(d)
    if string.len(fields) + 2 + string.len(u) <= 255 then
      fields = fields .. '\3' .. string.char(string.len(u)) .. u
    end
  end
end
if fields == '' and ARGV[4] == '' then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
else
  redis.call('SET', KEYS[1], '\2C' .. string.sub(v, 3, 10) .. string.char(string.len(fields)) .. fields .. ARGV[4], 'PX', ARGV[3])
end
` + announce + `
return 0
`

// completeAsClaimedSrc is Complete's usual case in its least form: KEYS[1]
// the record, ARGV[1] the in-progress record the claim wrote (its token),
// ARGV[2] the completed record the client built from it (appendCompleted,
// without the result), ARGV[3] the retention in milliseconds, ARGV[4] the
// result, left out when empty. When the record is ARGV[1], it becomes
// ARGV[2] followed by the result, as completeSrc would write it; otherwise
// nothing changes and the reply is replyNotAsClaimed, on which the store
// runs completeSrc, which tells why (lost, already completed) or builds
// the record itself. Half of completeSrc's arguments and none of its
// decoding: per message, less for the server to parse and run.
const completeAsClaimedSrc = `
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 5 end
redis.call('SET', KEYS[1], ARGV[4] and ARGV[2] .. ARGV[4] or ARGV[2], 'PX', ARGV[3])
` + announce + `
return 0
`

// releaseSrc is compare-and-set: KEYS[1] the record, ARGV[1] the raw
// token, ARGV[2] the compact completed record. A version 2 record becomes
// released (state 'R', the rest kept) for what is left of its lease
// (KEEPTTL); a version 1 record is deleted.
const releaseSrc = ownedPrelude + `
if f == 2 then
  redis.call('SET', KEYS[1], '\2R' .. string.sub(v, 3), 'KEEPTTL')
else
  redis.call('DEL', KEYS[1])
end
` + announce + `
return 0
`

// announce ends completeSrc, completeAsClaimedSrc and releaseSrc: it tells the waiters of the
// record (Store.WatchKey) that it changed, with an empty message on the
// shard channel named like the record's key, which hashes to the record's
// slot by construction (on a Cluster, a script may only reach its own
// slot). SPUBLISH to a channel nobody subscribed to costs a lookup. pcall:
// a refused publish (an ACL without the channel) must not fail the write
// before it, which a script does not undo; the waiters then poll.
const announce = `redis.pcall('SPUBLISH', KEYS[1], '')`

// discardSrc is compare-and-delete, with the arguments of releaseSrc: a
// claim that WAIT did not confirm is undone without counting it.
const discardSrc = ownedPrelude + `
redis.call('DEL', KEYS[1])
return 0
`

// takeoverSrc replaces a released record (ARGV[1], as the claim read it)
// with the claim's in-progress record ARGV[2], for ARGV[3] milliseconds:
// compare-and-set on the whole value. It replies nil when it wrote the
// record (also when the key was gone by then), else the value now under
// the key, which the claim decides on as it decides on SET NX's reply.
// The claim built ARGV[2] with a fence larger than ARGV[1]'s (see
// takeoverValue): the compare on the whole value makes the write atomic
// with the fence it read, so no clock is read here.
const takeoverSrc = `
local v = redis.call('GET', KEYS[1])
if v and v ~= ARGV[1] then return v end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return false
`

// extendSrc is compare-and-pexpire: KEYS[1] the record, ARGV[1] the raw
// token, ARGV[2] the compact completed record, ARGV[3] the new lease in
// milliseconds, counted from now on the server's clock.
const extendSrc = ownedPrelude + `
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 0
`

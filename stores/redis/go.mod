module github.com/watermill-dedup/watermill-dedup/stores/redis

go 1.26.0

require (
	github.com/ThreeDotsLabs/watermill v1.5.1
	github.com/redis/go-redis/v9 v9.23.0
	github.com/watermill-dedup/watermill-dedup v0.0.0-00010101000000-000000000000
)

require (
	github.com/cenkalti/backoff/v5 v5.0.3 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/lithammer/shortuuid/v3 v3.0.7 // indirect
	github.com/oklog/ulid v1.3.1 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/sony/gobreaker v1.0.0 // indirect
	github.com/tidwall/gjson v1.20.2 // indirect
	github.com/tidwall/match v1.1.1 // indirect
	github.com/tidwall/pretty v1.3.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
)

// The modules of this repository, from this checkout.
replace github.com/watermill-dedup/watermill-dedup => ../..

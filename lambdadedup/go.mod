module github.com/watermill-dedup/watermill-dedup/lambdadedup

go 1.26.0

require (
	github.com/ThreeDotsLabs/watermill v1.5.1
	github.com/aws/aws-lambda-go v1.55.1
	github.com/jmespath/go-jmespath v0.4.0
	github.com/watermill-dedup/watermill-dedup v0.0.0-00010101000000-000000000000
)

require (
	github.com/google/uuid v1.6.0 // indirect
	github.com/lithammer/shortuuid/v3 v3.0.7 // indirect
	github.com/oklog/ulid v1.3.1 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/tidwall/gjson v1.20.2 // indirect
	github.com/tidwall/match v1.1.1 // indirect
	github.com/tidwall/pretty v1.3.0 // indirect
)

// The modules of this repository, from this checkout.
replace github.com/watermill-dedup/watermill-dedup => ..

module github.com/watermill-dedup/watermill-dedup/docs

go 1.26.0

require (
	github.com/hashicorp/hcl/v2 v2.25.0
	github.com/redis/go-redis/v9 v9.23.0
	github.com/watermill-dedup/watermill-dedup v0.0.0-00010101000000-000000000000
	go.yaml.in/yaml/v3 v3.0.6
)

require (
	github.com/agext/levenshtein v1.2.1 // indirect
	github.com/apparentlymart/go-textseg/v15 v15.0.0 // indirect
	github.com/apparentlymart/go-textseg/v17 v17.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/mitchellh/go-wordwrap v1.0.1 // indirect
	github.com/zclconf/go-cty v1.19.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/mod v0.29.0 // indirect
	golang.org/x/sync v0.18.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
	golang.org/x/text v0.31.0 // indirect
	golang.org/x/tools v0.38.0 // indirect
)

// The modules of this repository, from this checkout.
replace github.com/watermill-dedup/watermill-dedup => ..

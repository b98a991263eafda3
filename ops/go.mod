module github.com/watermill-dedup/watermill-dedup/ops

go 1.26.0

replace github.com/watermill-dedup/watermill-dedup => ../

require github.com/grafana/grafana-foundation-sdk/go v0.0.22

// Package embedded starts in-process servers for programs that must run with
// no setup: a Kafka-protocol cluster (franz-go's kfake), a Redis (miniredis)
// and a NATS server with JetStream (nats-server). Each listens on a free
// 127.0.0.1 port, keeps its data in memory or in a temporary directory, and
// is gone when Close returns or the process exits. They are for the lab and
// tests, not for sharing records between processes.
package embedded

// Package brokers connects the lab (cmd/dedup-lab) and the runnable
// examples to the servers they run on, configured the standard way: Kafka
// from KAFKA_BROKERS, SQS, SNS and DynamoDB from the AWS SDK's environment
// (AWS_REGION, credentials, AWS_ENDPOINT_URL, ...), Redis from REDIS_ADDR.
// Where a variable is unset it starts an embedded server instead when one
// exists (a kfake Kafka-protocol cluster, a miniredis), so the programs run
// with no setup; SQS, SNS and DynamoDB have no embedded form, and the
// UnreachableError of a ping carries a one-line hint on starting the local
// emulator.
//
// It also holds the small adapters the AWS brokers need with watermill-aws
// v1.0.1: an SNS marshaler that publishes with TopicArn (accepted by AWS and
// by emulators, which reject TargetArn), SQS metadata (MessageId, receipt
// handle) on received messages, and a middleware that shortens the
// redelivery delay of a nacked SQS message.
package brokers

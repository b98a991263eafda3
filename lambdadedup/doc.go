// Package lambdadedup deduplicates SQS consumers that run on AWS Lambda: a
// batch handler for events.SQSEvent (an event source mapping with
// ReportBatchItemFailures) that claims every record through dedup.Engine,
// the engine of the Watermill middleware, and reports the
// records to retry in events.SQSEventResponse.BatchItemFailures.
//
// IMPORTANT: turn ReportBatchItemFailures on in the event source mapping
// (FunctionResponseTypes: ["ReportBatchItemFailures"]). Without it Lambda
// ignores the batch item failures: a batch whose invocation returns no
// error is deleted whole (SQS) or passed (streams), the records that
// failed or found their key in progress included, and they are lost.
// Handle returns ErrBatchFailed when every record of a batch failed, which
// keeps such a batch even without the setting, but a batch with one record
// processed and another failed needs it.
//
// The same Handler serves the other event sources: HandleKinesis and
// HandleDynamoDB process a stream batch in order and stop at the first
// failure, reporting its sequence number (AWS retries the shard from
// there); HandleEventBridge handles one event and returns an error to have
// Lambda retry it. The key comes from the record's data, never from the
// sequence number or event id, which are refused as keys (ErrTransportKey).
//
// The same key functions (package keyfuncs) work on SQS records: Message
// converts a record as watermill-aws's SQS subscriber converts a received
// message (payload = body, metadata = message attributes, UUID = the
// Watermill UUID attribute or the MessageId). With the same store, scope
// and key function, a message handled here is a duplicate for a Watermill
// router (dedup.New(...).Middleware), and the other way round: a consumer
// moves between Lambda and a router without touching its records.
//
// Per record:
//
//	outcome                                   reported      the record
//	key free, handler ok                      success       completed; SQS deletes it
//	key free, handler error or panic          failure       released; back after the visibility timeout
//	key completed (duplicate)                 success       handler not called
//	key held by another consumer              failure       ErrInProgress: never acked (Dedup.InProgressWait: waits for it first, up to the deadline)
//	no key, transport id as key, key reused   failure       to the DLQ by the redrive policy (DropPermanent: success, error log)
//	store unreachable                         failure       fail closed (Dedup.FailOpen: handler runs unclaimed)
//	less than DeadlineMargin left             failure       not started; its claim released (none at all when the invocation starts so; a Dedup.InProgressWait ends by then)
//	FIFO: after a failure in its group        failure       not started (the group's order holds)
//
// # Batches
//
// Every handler claims its batch at once, through dedup.Engine.DoBatch:
// the claims of all records go to the store together (Redis: one
// pipeline; PostgreSQL: one round trip; DynamoDB: concurrent conditional
// writes; memory: one lock), before any handler runs; the completions go
// together after the last handler, and so do the releases of the records
// that failed or did not start. A batch of 10 new records costs 2 store
// round trips instead of 20. The same key twice in one batch runs once:
// the copy is a duplicate of the first record's success. Since each lease
// ends at the invocation's deadline, the claims taken up front need no
// heartbeat. See docs/batches.md.
//
// With Dedup.Shadow the handler runs for every record, as without the
// adapter (a record without a usable key or with a failing fingerprint
// runs unclaimed, logged would_reject), and only its own error fails the
// record. The key is taken as on the router, by the same function
// (dedup.Config.TakeKey): Dedup.TransportIDs names further transport ids of
// a record (by default the message attributes sqs_message_id, MessageId,
// message_id and sns_message_id), and a key equal to one is refused
// (ErrTransportKey). A panicking key function, Fingerprint or TransportIDs
// is a permanent error of its record, not a handler panic.
//
// Logging: with Config.Dedup.Logger unset, what is logged at error level
// (records refused for good, handler panics, store errors, lost claims,
// fail-open runs) reaches log/slog's default logger (dedup.DefaultLogger),
// which Lambda sends to CloudWatch Logs, and nothing else: the record
// that ends up in BatchItemFailures for want of a key is in the log too.
// A record refused again on every redelivery is logged once, then every
// 30s at most with a count. watermill.NopLogger{} logs nothing.
//
// Each claim's lease ends at the invocation's deadline at the latest
// (heartbeats included), so a timed-out invocation leaves no record in
// progress longer than it could have run. What a claim cannot promise is
// the same as in the router: a crash after the effect and before Complete
// runs the effect again on redelivery.
//
// Usage:
//
//	h, err := lambdadedup.New(lambdadedup.Config{
//		Dedup: dedup.Config{
//			Store: store,
//			Key:   keyfuncs.JSON("order_id"),
//			Scope: "charge-orders", // required: the router's handler name, to share records
//		},
//	}, chargeOrder) // func(msg *message.Message) error
//	if err != nil { ... }
//	lambda.Start(h.Handle)
//
// Package esm runs such a handler on an SQS queue (an emulator) without
// deploying it.
package lambdadedup

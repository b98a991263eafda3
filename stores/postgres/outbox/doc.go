// Package outbox writes the messages a Watermill handler produces into
// PostgreSQL, in the transaction in which stores/postgres TxMiddleware
// commits the handler's writes and completes its dedup key, and delivers
// them to the real broker afterwards with Watermill's forwarder: the
// transactional outbox, on watermill-sql's PostgreSQL publisher and
// subscriber (pgx) and components/forwarder.
//
//	ob, err := outbox.New(pool, outbox.Config{})
//	err = ob.Migrate(ctx)
//	router.AddMiddleware(deduplicator.Middleware, store.TxMiddleware, ob.Middleware)
//	router.AddHandler("charge-orders", "orders", sub, "payments", pub, charge) // charge returns the payment event
//	fwd, err := ob.NewForwarder(pub, forwarder.Config{})
//	go fwd.Run(ctx)
//
// Guarantee: the handler's database writes, its completed key and its
// outgoing messages commit together or not at all. A crash before COMMIT
// leaves none of them (the redelivery, once the key's lease ends, runs the
// handler once and writes its messages once); a crash after COMMIT leaves
// all of them, and the forwarder (restarted) publishes the messages. The
// forwarder itself is at least once: it records how far it got after the
// broker accepted a message, so a crash between the two publishes that
// message again; consumers deduplicate it by its business key (this
// library's middleware).
package outbox

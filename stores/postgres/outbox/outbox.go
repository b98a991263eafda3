package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/watermill-dedup/watermill-dedup/stores/postgres"
)

// DB is what the outbox needs from PostgreSQL: the method set of
// *pgxpool.Pool, which is what callers normally pass.
type DB interface {
	Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error)
}

var (
	// ErrNoTransaction is returned by Middleware for a message whose
	// context holds no transaction of stores/postgres TxMiddleware: the
	// outbox middleware was added before (outside) TxMiddleware, or without
	// it. Nothing ran. It is a configuration error.
	ErrNoTransaction = errors.New("outbox: no TxMiddleware transaction in the message context; add the outbox middleware after store.TxMiddleware")

	// ErrNoTopic is returned by Middleware when the handler produced
	// messages but its context names no publish topic (the handler was not
	// added with router.AddHandler, which sets it). The transaction is
	// rolled back.
	ErrNoTopic = errors.New("outbox: the handler produced messages but has no publish topic; add it with router.AddHandler")
)

// Outbox writes a handler's output messages into PostgreSQL in the
// handler's transaction (Middleware) and delivers them to a broker
// (NewForwarder). Create it with New; it is safe for concurrent use.
type Outbox struct {
	db      DB
	cfg     Config
	schema  sql.DefaultPostgreSQLSchema
	offsets sql.DefaultPostgreSQLOffsetsAdapter
}

// New validates config, applies its defaults and returns an Outbox on db
// (normally a *pgxpool.Pool). It does not touch the database: call Migrate
// once.
func New(db DB, config Config) (*Outbox, error) {
	var errs []error
	if db == nil {
		errs = append(errs, errors.New("outbox: DB is required"))
	}
	if err := config.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	config.setDefaults()
	o := &Outbox{db: db, cfg: config}
	o.schema = sql.DefaultPostgreSQLSchema{GenerateMessagesTableName: func(topic string) string { return o.table("watermill_" + topic) }}
	o.offsets = sql.DefaultPostgreSQLOffsetsAdapter{GenerateMessagesOffsetsTableName: func(topic string) string { return o.table("watermill_offsets_" + topic) }}
	return o, nil
}

func (o *Outbox) table(name string) string {
	if o.cfg.Schema == "" {
		return pgx.Identifier{name}.Sanitize()
	}
	return pgx.Identifier{o.cfg.Schema, name}.Sanitize()
}

// Migrate creates the outbox's two tables if they do not exist, with
// watermill-sql's own DDL, in one transaction under watermill-sql's
// advisory lock: idempotent and safe to run from several processes at
// once (a few round trips).
func (o *Outbox) Migrate(ctx context.Context) error {
	queries, err := o.schema.SchemaInitializingQueries(sql.SchemaInitializingQueriesParams{Topic: o.cfg.Topic})
	if err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	more, err := o.offsets.SchemaInitializingQueries(sql.OffsetsSchemaInitializingQueriesParams{Topic: o.cfg.Topic})
	if err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	err = pgx.BeginTxFunc(ctx, o.db, pgx.TxOptions{}, func(tx pgx.Tx) error {
		for _, q := range append(queries, more...) {
			if _, err := tx.Exec(ctx, q.Query, q.Args...); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	return nil
}

// Middleware is a Watermill middleware that writes the messages the
// handler returns into the outbox, in the transaction of stores/postgres
// TxMiddleware, instead of letting the router publish them: they commit
// with the handler's writes and its completed key, or not at all. Add it
// after TxMiddleware (the first middleware added is the outermost):
//
//	router.AddMiddleware(deduplicator.Middleware, store.TxMiddleware, ob.Middleware)
//
// Each message is destined for the handler's publish topic (the one given
// to router.AddHandler); the forwarder (NewForwarder) publishes it there
// after COMMIT. The router gets no messages back, so the publisher given to
// AddHandler is not called. A handler that returns an error or no message
// writes nothing. A message without a TxMiddleware transaction fails with
// ErrNoTransaction before the handler runs; messages without a publish
// topic fail with ErrNoTopic (the transaction rolls back). The dedup
// middleware's Replay has nothing to store (TxMiddleware sees no messages):
// a duplicate is acked without publishing, its messages having gone
// through the outbox.
//
// Cost: one INSERT of all the handler's messages (one round trip) in the
// transaction, only when the handler returned messages.
func (o *Outbox) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		tx, ok := postgres.TxFromContext(ctx)
		if !ok {
			return nil, ErrNoTransaction
		}
		out, err := h(msg)
		if err != nil || len(out) == 0 {
			return nil, err
		}
		topic := message.PublishTopicFromCtx(ctx)
		if topic == "" {
			return nil, ErrNoTopic
		}
		if err := o.write(ctx, tx, topic, out); err != nil {
			return nil, err
		}
		return nil, nil
	}
}

// write inserts msgs, enveloped for topic, into the outbox through tx.
func (o *Outbox) write(ctx context.Context, tx pgx.Tx, topic string, msgs []*message.Message) error {
	pub, err := sql.NewPublisher(sql.TxFromPgx(tx), sql.PublisherConfig{SchemaAdapter: o.schema}, o.cfg.Logger)
	if err != nil {
		return fmt.Errorf("outbox: %w", err)
	}
	for _, m := range msgs {
		m.SetContext(ctx) // watermill-sql runs the INSERT with the first message's context
	}
	if err := forwarder.NewPublisher(pub, forwarder.PublisherConfig{ForwarderTopic: o.cfg.Topic}).Publish(topic, msgs...); err != nil {
		return fmt.Errorf("outbox: writing %d messages for %q: %w", len(msgs), topic, err)
	}
	return nil
}

// NewForwarder returns Watermill's forwarder reading this outbox (a
// watermill-sql subscriber on db) and publishing each message with
// publisher to the topic it was written for. Run it with Run (blocking)
// and stop it with Close. config is Watermill's own; its ForwarderTopic
// must be empty or Config.Topic.
//
// Delivery is at least once: the forwarder records how far it got in the
// same transaction that read the messages, after publisher accepted them,
// so a crash between the two publishes those messages again after a
// restart. The order is watermill-sql's: by transaction id (assigned at a
// transaction's first write), not by commit, and nothing is read past the
// oldest transaction still open that has written anything in the database
// (any table): one long handler transaction, or a transaction left open by
// another program on the same database, holds back all delivery until it
// ends (watch Pending). Several forwarders on one outbox take turns (a row
// lock), they do not share the work.
func (o *Outbox) NewForwarder(publisher message.Publisher, config forwarder.Config) (*forwarder.Forwarder, error) {
	if config.ForwarderTopic != "" && config.ForwarderTopic != o.cfg.Topic {
		return nil, fmt.Errorf("outbox: forwarder.Config.ForwarderTopic is %q, the outbox is %q", config.ForwarderTopic, o.cfg.Topic)
	}
	config.ForwarderTopic = o.cfg.Topic
	sub, err := sql.NewSubscriber(sql.BeginnerFromPgx(o.db), sql.SubscriberConfig{
		SchemaAdapter:  o.schema,
		OffsetsAdapter: o.offsets,
		PollInterval:   o.cfg.PollInterval,
	}, o.cfg.Logger)
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	fwd, err := forwarder.NewForwarder(sub, publisher, o.cfg.Logger, config)
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	return fwd, nil
}

// pendingSQL counts the committed messages past the forwarder's last
// acknowledged position, in its order (transaction id, then offset).
const pendingSQL = `
SELECT count(*) FROM {messages} AS m
WHERE NOT EXISTS (
  SELECT FROM {offsets} AS o
  WHERE o.consumer_group = '' AND (m.transaction_id, m."offset") <= (o.last_processed_transaction_id, o.offset_acked))`

// Pending returns how many committed messages the forwarder has not
// delivered yet: the outbox's backlog, to monitor (one query, which reads
// every row still in the outbox table: the forwarder never deletes them).
func (o *Outbox) Pending(ctx context.Context) (int64, error) {
	q := strings.NewReplacer("{messages}", o.schema.MessagesTable(o.cfg.Topic),
		"{offsets}", o.offsets.MessagesOffsetsTable(o.cfg.Topic)).Replace(pendingSQL)
	var n int64
	if err := o.db.QueryRow(ctx, q).Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox: pending: %w", err)
	}
	return n, nil
}

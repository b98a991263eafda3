package producerkey

import (
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/internal/keys"
)

// DefaultMetadata is the metadata entry Publisher stamps the key into.
const DefaultMetadata = "idempotency_key"

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// Metadata names the metadata entry that carries the key. Defaults to
	// DefaultMetadata ("idempotency_key"); the consumer's key function is
	// then keyfuncs.Metadata(DefaultMetadata).
	Metadata string

	// Key returns the message's business key, the same for every message
	// built for one intent and different for two intents: it names the
	// intent, not the entity ("order-42-charged", not "order-42", when two
	// kinds of events about one order share a topic and a consumer, or the
	// second is skipped as a duplicate of the first). A key the consumer's
	// dedup would refuse (blank, control characters, not UTF-8, longer than
	// 1024 bytes) fails Publish with ErrNoKey, as does a failing or
	// panicking Key. Defaults to nil: a random key, made the first time the
	// message is published; a retry must then publish the same
	// *message.Message again to keep it.
	Key func(msg *message.Message) (string, error)
}

func (c *PublisherConfig) setDefaults() {
	if c.Metadata == "" {
		c.Metadata = DefaultMetadata
	}
}

// Publisher is a message.Publisher that stamps one idempotency key per
// intent into each message's metadata before passing the messages on.
type Publisher struct {
	pub    message.Publisher
	config PublisherConfig
}

// NewPublisher returns pub decorated with the key stamp; every
// PublisherConfig is valid (zero fields take their defaults). It fails only
// on a nil pub.
func NewPublisher(pub message.Publisher, config PublisherConfig) (*Publisher, error) {
	if pub == nil {
		return nil, errors.New("producerkey: NewPublisher: publisher is nil")
	}
	config.setDefaults()
	return &Publisher{pub: pub, config: config}, nil
}

// Publish stamps every message that has no key yet, then publishes them
// all with the decorated publisher. A message that already carries the
// entry keeps it: that is a retry of the same message, or a key the caller
// chose. So publishing a message again after an error (the broker may have
// stored it before the error) sends the same key, and the consumer skips
// the second copy as a duplicate.
//
// It writes to the messages' metadata (that is where the key lives between
// attempts), so one message must not be published from two goroutines at
// once. When Config.Key fails for a message or gives a key the consumer
// would refuse, Publish returns the error (wrapping dedup.ErrNoKey for a
// refused key or when the key function's error does) and publishes
// nothing. Cost: the key function, or 16 bytes from crypto/rand,
// per message not yet stamped; nothing for a retry.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	for _, msg := range msgs {
		if err := p.stamp(msg); err != nil {
			return err
		}
	}
	return p.pub.Publish(topic, msgs...)
}

// stamp sets the key entry of msg unless it has one.
func (p *Publisher) stamp(msg *message.Message) error {
	if msg == nil {
		return errors.New("producerkey: Publish: nil message")
	}
	if msg.Metadata == nil {
		msg.Metadata = message.Metadata{}
	}
	if msg.Metadata.Get(p.config.Metadata) != "" {
		return nil
	}
	if p.config.Key == nil {
		msg.Metadata.Set(p.config.Metadata, newKey())
		return nil
	}
	key, err := p.key(msg)
	if err == nil {
		if reason := keys.Problem(key, keys.DefaultMaxLength); reason != "" {
			err = &dedup.KeyError{Reason: reason}
		}
	}
	if err != nil {
		return fmt.Errorf("producerkey: key of message %s: %w", msg.UUID, err)
	}
	msg.Metadata.Set(p.config.Metadata, key)
	return nil
}

// key runs Config.Key; a panic is a *dedup.KeyError, as in the consumer's
// middleware.
func (p *Publisher) key(msg *message.Message) (key string, err error) {
	defer func() {
		if r := recover(); r != nil {
			key, err = "", &dedup.KeyError{Reason: fmt.Sprintf("key function panicked: %v", r), MessageUUID: msg.UUID}
		}
	}()
	return p.config.Key(msg)
}

// Close closes the decorated publisher.
func (p *Publisher) Close() error { return p.pub.Close() }

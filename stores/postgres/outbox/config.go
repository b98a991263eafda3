package outbox

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// Defaults applied by New to zero fields of Config.
const (
	DefaultTopic        = "dedup_outbox"
	DefaultPollInterval = time.Second
)

// Config configures an Outbox. It is passed by value; New never writes to
// the caller's copy.
type Config struct {
	// Topic names the outbox: the watermill-sql topic whose tables hold the
	// enveloped messages ("watermill_<Topic>") and how far the forwarder
	// got ("watermill_offsets_<Topic>"). Defaults to "dedup_outbox".
	// Letters, digits and "-$:._" only (watermill-sql's rule), at most 45
	// bytes (the longer table name stays within PostgreSQL's 63).
	Topic string

	// Schema is the PostgreSQL schema of both tables. Defaults to "": they
	// are resolved through the connection's search_path. Migrate does not
	// create the schema.
	Schema string

	// PollInterval is how long the forwarder waits before looking again
	// when it found the outbox empty: the delivery delay of a message
	// written to an idle outbox, one query per interval. Defaults to 1s.
	PollInterval time.Duration

	// Logger receives the watermill-sql publisher's, subscriber's and
	// forwarder's logs. Defaults to watermill.NopLogger.
	Logger watermill.LoggerAdapter
}

// maxTopicLength keeps "watermill_offsets_" + Topic within 63 bytes.
const maxTopicLength = 63 - len("watermill_offsets_")

var topicCharacters = regexp.MustCompile(`^[A-Za-z0-9\-$:._]+$`)

func (c *Config) setDefaults() {
	if c.Topic == "" {
		c.Topic = DefaultTopic
	}
	if c.PollInterval == 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
}

// Validate reports every problem in the configuration at once (joined with
// errors.Join), after applying defaults to a copy. Zero values are not
// problems: they take their defaults.
func (c Config) Validate() error {
	c.setDefaults()
	var errs []error
	if !topicCharacters.MatchString(c.Topic) {
		errs = append(errs, fmt.Errorf("outbox: Config.Topic %q: only letters, digits and -$:._ are allowed", c.Topic))
	}
	if len(c.Topic) > maxTopicLength {
		errs = append(errs, fmt.Errorf("outbox: Config.Topic is %d bytes, at most %d", len(c.Topic), maxTopicLength))
	}
	if len(c.Schema) > 63 || strings.ContainsRune(c.Schema, 0) {
		errs = append(errs, fmt.Errorf("outbox: Config.Schema must be at most 63 bytes without NUL"))
	}
	if c.PollInterval < 0 {
		errs = append(errs, fmt.Errorf("outbox: Config.PollInterval must not be negative, got %v", c.PollInterval))
	}
	return errors.Join(errs...)
}

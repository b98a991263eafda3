// Package kafkabroker wires Kafka for the lab and its tests through
// watermill-kafka/v3 (Sarama): one Sarama configuration tuned for fast group
// joins, topic administration, and the consumer group's lag and assignment,
// which tell when every ack reached the broker.
package kafkabroker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
)

// Env names the environment variable with a comma-separated list of Kafka
// bootstrap brokers ("host:9092,host2:9092").
const Env = "KAFKA_BROKERS"

// Kafka is a Kafka cluster reached through its bootstrap brokers.
type Kafka struct {
	// Brokers are the bootstrap addresses.
	Brokers []string
	// Partitioner picks the partition of a published message. Defaults to
	// Sarama's random partitioner (see Publisher).
	Partitioner sarama.PartitionerConstructor
}

// ParseBrokers splits a comma-separated list (typically the value of
// KAFKA_BROKERS) into addresses, dropping blanks; nil when there are none.
func ParseBrokers(list string) []string {
	var brokers []string
	for _, b := range strings.Split(list, ",") {
		if b = strings.TrimSpace(b); b != "" {
			brokers = append(brokers, b)
		}
	}
	return brokers
}

// SaramaConfig returns the Sarama configuration the publisher and the
// subscribers use: Kafka protocol 2.8, consumer groups that start from the
// oldest offset (a group created after the first messages were published
// still reads them), commit every 100ms, heartbeat every 500ms and retry a
// rebalance after 100ms, so that joining and leaving a group takes well
// under a second instead of several.
func (k *Kafka) SaramaConfig() *sarama.Config {
	c := sarama.NewConfig()
	c.Version = sarama.V2_8_0_0
	c.ClientID = "watermill-dedup"
	c.Producer.Return.Successes = true
	c.Producer.Retry.Max = 10
	c.Producer.Partitioner = sarama.NewRandomPartitioner
	if k.Partitioner != nil {
		c.Producer.Partitioner = k.Partitioner
	}
	c.Metadata.Retry.Backoff = 100 * time.Millisecond
	c.Consumer.Return.Errors = true
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	c.Consumer.Offsets.AutoCommit.Interval = 100 * time.Millisecond
	c.Consumer.Group.Heartbeat.Interval = 500 * time.Millisecond
	c.Consumer.Group.Session.Timeout = 6 * time.Second
	c.Consumer.Group.Rebalance.Retry.Backoff = 100 * time.Millisecond
	c.Consumer.Group.Rebalance.Timeout = 10 * time.Second
	return c
}

// CreateTopic creates topic with the given number of partitions
// (replication factor 1 on the embedded cluster, 3 or the number of brokers
// otherwise is the broker's business: -1 asks for its default). An existing
// topic is not an error.
func (k *Kafka) CreateTopic(ctx context.Context, topic string, partitions int32) error {
	admin, err := sarama.NewClusterAdmin(k.Brokers, k.SaramaConfig())
	if err != nil {
		return fmt.Errorf("kafkabroker: Kafka admin: %w", err)
	}
	defer func() { _ = admin.Close() }()
	err = admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: -1}, false)
	if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
		return fmt.Errorf("kafkabroker: creating Kafka topic %q: %w", topic, err)
	}
	return ctx.Err()
}

// DeleteTopic deletes topic (used to clean up after a lab run on real
// brokers).
func (k *Kafka) DeleteTopic(topic string) error {
	admin, err := sarama.NewClusterAdmin(k.Brokers, k.SaramaConfig())
	if err != nil {
		return err
	}
	defer func() { _ = admin.Close() }()
	return admin.DeleteTopic(topic)
}

// Publisher returns a watermill-kafka publisher (Sarama sync producer).
// Messages are spread over the partitions by k.Partitioner, at random by
// default, so copies of one order land on different partitions (a producer
// keying messages by order id would put them all on one); marshaler nil
// means kafka.DefaultMarshaler.
func (k *Kafka) Publisher(marshaler kafka.Marshaler, logger watermill.LoggerAdapter) (*kafka.Publisher, error) {
	if marshaler == nil {
		marshaler = kafka.DefaultMarshaler{}
	}
	return kafka.NewPublisher(kafka.PublisherConfig{
		Brokers:               k.Brokers,
		Marshaler:             marshaler,
		OverwriteSaramaConfig: k.SaramaConfig(),
	}, logger)
}

// Subscriber returns a watermill-kafka subscriber in consumer group group.
// Each Subscribe call joins the group as one more member. A nacked message
// is offered again after 20ms, from the same partition consumer.
func (k *Kafka) Subscriber(group string, logger watermill.LoggerAdapter) (*kafka.Subscriber, error) {
	return kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               k.Brokers,
		Unmarshaler:           kafka.DefaultMarshaler{},
		OverwriteSaramaConfig: k.SaramaConfig(),
		ConsumerGroup:         group,
		NackResendSleep:       20 * time.Millisecond,
		ReconnectRetrySleep:   100 * time.Millisecond,
	}, logger)
}

// Lag returns how many messages of topic the consumer group has not
// committed yet: the sum over partitions of the high-water mark minus the
// committed offset (a partition without a commit counts from its log start).
// Zero means every published message was consumed and its offset committed.
func (k *Kafka) Lag(ctx context.Context, group, topic string) (int64, error) {
	client, err := sarama.NewClient(k.Brokers, k.SaramaConfig())
	if err != nil {
		return 0, err
	}
	defer func() { _ = client.Close() }()
	partitions, err := client.Partitions(topic)
	if err != nil {
		return 0, err
	}
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return 0, err
	}
	committed, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: partitions})
	if err != nil {
		return 0, err
	}
	if committed.Err != sarama.ErrNoError {
		return 0, committed.Err
	}
	var lag int64
	for _, p := range partitions {
		newest, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return 0, err
		}
		from := int64(-1)
		if b := committed.GetBlock(topic, p); b != nil {
			if b.Err != sarama.ErrNoError {
				return 0, b.Err
			}
			from = b.Offset
		}
		if from < 0 {
			if from, err = client.GetOffset(topic, p, sarama.OffsetOldest); err != nil {
				return 0, err
			}
		}
		if newest > from {
			lag += newest - from
		}
	}
	return lag, ctx.Err()
}

// GroupAssignment returns, for each member of the consumer group, the
// partitions of topic assigned to it. A group that is rebalancing has no
// assignment yet.
func (k *Kafka) GroupAssignment(group, topic string) (state string, members [][]int32, err error) {
	admin, err := sarama.NewClusterAdmin(k.Brokers, k.SaramaConfig())
	if err != nil {
		return "", nil, err
	}
	defer func() { _ = admin.Close() }()
	groups, err := admin.DescribeConsumerGroups([]string{group})
	if err != nil {
		return "", nil, err
	}
	if len(groups) != 1 {
		return "", nil, fmt.Errorf("kafkabroker: describe group %q: %d answers", group, len(groups))
	}
	g := groups[0]
	if g.Err != sarama.ErrNoError {
		return "", nil, g.Err
	}
	for _, m := range g.Members {
		a, err := m.GetMemberAssignment()
		if err != nil {
			return "", nil, err
		}
		var parts []int32
		if a != nil {
			parts = a.Topics[topic]
		}
		members = append(members, parts)
	}
	return g.State, members, nil
}

package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/twmb/franz-go/pkg/kfake"
)

// cluster is the Kafka cluster of the example: the brokers of
// KAFKA_BROKERS, or an in-process Kafka-protocol cluster (kfake).
type cluster struct {
	brokers []string
	// partitioner spreads published messages over partitions. Defaults to
	// Sarama's random partitioner, so copies of one order land on
	// different partitions (a producer keying by order id would put them
	// all on one).
	partitioner sarama.PartitionerConstructor
	embedded    *kfake.Cluster
}

// connectKafka uses the comma-separated bootstrap brokers in list, or starts
// an embedded cluster when list is empty.
func connectKafka(list string) (*cluster, error) {
	var brokers []string
	for _, b := range strings.Split(list, ",") {
		if b = strings.TrimSpace(b); b != "" {
			brokers = append(brokers, b)
		}
	}
	if len(brokers) > 0 {
		return &cluster{brokers: brokers}, nil
	}
	// kfake's minimum session timeout is 6s; Sarama's is set to 6s below
	// and groups may go down to 1s.
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		return nil, fmt.Errorf("starting the embedded Kafka cluster: %w", err)
	}
	return &cluster{brokers: c.ListenAddrs(), embedded: c}, nil
}

func (k *cluster) close() {
	if k.embedded != nil {
		k.embedded.Close()
	}
}

func (k *cluster) describe() string {
	if k.embedded != nil {
		return "embedded Kafka (kfake) at " + strings.Join(k.brokers, ",")
	}
	return "Kafka at " + strings.Join(k.brokers, ",")
}

// saramaConfig: Kafka protocol 2.8, groups that start from the oldest
// offset, commits every 100ms, and heartbeats and rebalance retries short
// enough that joining a group takes well under a second.
func (k *cluster) saramaConfig() *sarama.Config {
	c := sarama.NewConfig()
	c.Version = sarama.V2_8_0_0
	c.Producer.Return.Successes = true
	c.Producer.Retry.Max = 10
	c.Producer.Partitioner = sarama.NewRandomPartitioner
	if k.partitioner != nil {
		c.Producer.Partitioner = k.partitioner
	}
	c.Metadata.Retry.Backoff = 100 * time.Millisecond
	c.Consumer.Return.Errors = true
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	c.Consumer.Offsets.AutoCommit.Interval = 100 * time.Millisecond
	c.Consumer.Group.Heartbeat.Interval = 500 * time.Millisecond
	c.Consumer.Group.Session.Timeout = 6 * time.Second
	c.Consumer.Group.Rebalance.Retry.Backoff = 100 * time.Millisecond
	return c
}

// createTopic creates topic with partitions partitions; an existing topic
// is not an error.
func (k *cluster) createTopic(topic string, partitions int32) error {
	admin, err := sarama.NewClusterAdmin(k.brokers, k.saramaConfig())
	if err != nil {
		return err
	}
	defer func() { _ = admin.Close() }()
	err = admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: -1}, false)
	if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
		return fmt.Errorf("creating topic %q: %w", topic, err)
	}
	return nil
}

func (k *cluster) publisher(logger watermill.LoggerAdapter) (*kafka.Publisher, error) {
	return kafka.NewPublisher(kafka.PublisherConfig{
		Brokers: k.brokers, Marshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: k.saramaConfig(),
	}, logger)
}

// subscriber joins consumer group group once per Subscribe call. A nacked
// message is offered again after 20ms, from the same partition.
func (k *cluster) subscriber(group string, logger watermill.LoggerAdapter) (*kafka.Subscriber, error) {
	return kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers: k.brokers, Unmarshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: k.saramaConfig(),
		ConsumerGroup: group, NackResendSleep: 20 * time.Millisecond, ReconnectRetrySleep: 100 * time.Millisecond,
	}, logger)
}

// lag returns how many messages of topic the group has not committed: per
// partition, the high-water mark minus the committed offset (or the log
// start without a commit).
func (k *cluster) lag(ctx context.Context, group, topic string) (int64, error) {
	client, err := sarama.NewClient(k.brokers, k.saramaConfig())
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
	var lag int64
	for _, p := range partitions {
		newest, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return 0, err
		}
		from := int64(-1)
		if b := committed.GetBlock(topic, p); b != nil && b.Err == sarama.ErrNoError {
			from = b.Offset
		}
		if from < 0 {
			if from, err = client.GetOffset(topic, p, sarama.OffsetOldest); err != nil {
				return 0, err
			}
		}
		lag += max(newest-from, 0)
	}
	return lag, ctx.Err()
}

// assignment returns the group's state and, per member, its partitions of
// topic.
func (k *cluster) assignment(group, topic string) (string, [][]int32, error) {
	admin, err := sarama.NewClusterAdmin(k.brokers, k.saramaConfig())
	if err != nil {
		return "", nil, err
	}
	defer func() { _ = admin.Close() }()
	groups, err := admin.DescribeConsumerGroups([]string{group})
	if err != nil {
		return "", nil, err
	}
	if len(groups) != 1 || groups[0].Err != sarama.ErrNoError {
		return "", nil, fmt.Errorf("describing group %q: %v", group, groups)
	}
	var members [][]int32
	for _, m := range groups[0].Members {
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
	return groups[0].State, members, nil
}

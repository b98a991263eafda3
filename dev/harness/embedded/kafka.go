package embedded

import (
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// Kafka is an in-process, in-memory Kafka-protocol cluster of one broker.
type Kafka struct {
	// Addrs are the bootstrap addresses (127.0.0.1:port).
	Addrs []string

	cluster *kfake.Cluster
}

// StartKafka starts a Kafka-protocol cluster on a free 127.0.0.1 port.
// Auto-created topics get partitions partitions (at least 1, Kafka's
// default). Consumer groups accept session timeouts down to 1s (Sarama's
// default is 10s, kfake's minimum 6s). Call Close to stop it.
func StartKafka(partitions int) (*Kafka, error) {
	c, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.DefaultNumPartitions(max(partitions, 1)),
		kfake.AllowAutoTopicCreation(),
		kfake.GroupMinSessionTimeout(time.Second),
	)
	if err != nil {
		return nil, fmt.Errorf("embedded: starting the Kafka cluster: %w", err)
	}
	return &Kafka{Addrs: c.ListenAddrs(), cluster: c}, nil
}

// Close stops the cluster; its topics are gone.
func (k *Kafka) Close() { k.cluster.Close() }

package redis_test

import (
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup/storetest"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	"github.com/watermill-dedup/watermill-dedup/stores/redis"
)

func batchFeatures() storetest.Features {
	f := features
	f.Batch, f.BatchRequestSize = true, redis.BatchRequestSize
	return f
}

// The batch cases on the shared server, each case on a store of its own
// that counts requests: a batch of new keys is one pipeline.
func TestBatchConformanceStandalone(t *testing.T) {
	f := batchFeatures()
	f.OneRequestBatch = true
	storetest.RunBatch(t, newCountingStore, f)
}

// The batch cases through a ClusterClient on a 3-master cluster: go-redis
// splits each pipeline per master by the slots of its keys.
func TestBatchConformanceCluster(t *testing.T) {
	cluster, err := testserver.StartRedisCluster(3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Close() })
	client := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cluster.Addrs})
	t.Cleanup(func() { _ = client.Close() })
	storetest.RunBatch(t, shared(newStore(t, client, redis.Config{KeyPrefix: "dedup-batch:"})), batchFeatures())
}

// With Config.WaitReplicas the batch methods fall back to single
// operations; the contract is the same (here with no replica to wait for:
// WAIT 0 answers at once).
func TestBatchConformanceOmitProvenance(t *testing.T) {
	storetest.RunBatch(t, shared(newStore(t, newClient(t), redis.Config{KeyPrefix: "dedup-batch-omit:", OmitProvenance: true})), batchFeatures())
}

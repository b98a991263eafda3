package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
)

// -effect-in-tx on a real redis-server and on a Redis Cluster: each charge
// is an INCR run by the script that completes the order's record, and the
// table read back holds one charge per order.
func TestLabCommandEffectInTxRedis(t *testing.T) {
	r, err := testserver.StartRedis()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	c, err := testserver.StartRedisCluster(3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	for _, addr := range []string{r.Addr, strings.Join(c.Addrs, ",")} {
		runLab(t, []string{"-store", "redis", "-redis-addr", addr, "-effect-in-tx", "-orders", "30", "-effect-time", "1ms", "-lose-acks", "2"},
			"charges table (Redis keys {<record key>}:charged, INCR run by the script that completes the record):",
			"  ORDER-003          1\n",
			"  31 orders charged 1 time(s)\n",
			"idempotency on:  31 charges for 31 distinct orders: every order charged exactly once")
	}
}

// -effect-in-tx on moto: the charges table is updated in the
// TransactWriteItems that completes each record. On dynalite, which has no
// transactions, the lab says what to run instead.
func TestLabCommandEffectInTxDynamo(t *testing.T) {
	dyn, err := testserver.StartDynalite()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dyn.Close() })
	t.Setenv("AWS_ENDPOINT_URL_DYNAMODB", dyn.Endpoint)
	var out, errOut bytes.Buffer
	if code := run([]string{"-store", "dynamo", "-effect-in-tx"}, &out, &errOut); code != 1 ||
		!strings.Contains(errOut.String(), "hint: -effect-in-tx needs TransactWriteItems, which dynalite lacks") {
		t.Fatalf("on dynalite: exit %d\n%s%s; want 1 and the hint", code, out.String(), errOut.String())
	}

	m, err := testserver.StartMoto()
	if errors.Is(err, testserver.ErrMotoMissing) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	t.Setenv("AWS_ENDPOINT_URL_DYNAMODB", m.Endpoint)
	out2 := runLab(t, []string{"-store", "dynamo", "-effect-in-tx", "-orders", "30", "-effect-time", "1ms"},
		"charges table (DynamoDB table dedup-lab-charges, UpdateItem ADD charges 1 in the TransactWriteItems that completes the record):",
		"  ORDER-003          1\n",
		"  31 orders charged 1 time(s)\n",
		"idempotency on:  31 charges for 31 distinct orders: every order charged exactly once")
	t.Log("\n" + out2)
}

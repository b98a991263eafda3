package testserver

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// moto_server answers the DynamoDB API on loopback only, and (unlike
// dynalite) returns the existing item with a failed conditional PutItem
// that asks for ReturnValuesOnConditionCheckFailure=ALL_OLD, as DynamoDB
// does: the stores/dynamo conformance run on moto relies on it.
func TestMoto(t *testing.T) {
	t.Parallel()
	m, err := StartMoto()
	if errors.Is(err, ErrMotoMissing) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if !strings.HasPrefix(m.Endpoint, "http://127.0.0.1:") {
		t.Fatalf("Endpoint = %q", m.Endpoint)
	}
	assertLoopbackOnly(t, portOf(t, m.Endpoint))
	awsJSON(t, m.Endpoint, "DynamoDB_20120810.CreateTable", `{"TableName":"tbl",
		"AttributeDefinitions":[{"AttributeName":"k","AttributeType":"S"}],
		"KeySchema":[{"AttributeName":"k","KeyType":"HASH"}],"BillingMode":"PAY_PER_REQUEST"}`)
	awsJSON(t, m.Endpoint, "DynamoDB_20120810.PutItem", `{"TableName":"tbl","Item":{"k":{"S":"x"},"v":{"S":"old"}}}`)

	req, _ := http.NewRequest("POST", m.Endpoint+"/", strings.NewReader(`{"TableName":"tbl",
		"Item":{"k":{"S":"x"},"v":{"S":"new"}},"ConditionExpression":"attribute_not_exists(k)",
		"ReturnValuesOnConditionCheckFailure":"ALL_OLD"}`))
	req.Header.Set("Content-Type", "application/x-amz-json-1.0")
	req.Header.Set("X-Amz-Target", "DynamoDB_20120810.PutItem")
	req.Header.Set("X-Amz-Date", time.Now().UTC().Format("20060102T150405Z"))
	req.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential=test/20200101/us-east-1/dynamodb/aws4_request, SignedHeaders=host;x-amz-date, Signature=0")
	resp, err := apiClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != 400 || !strings.Contains(string(body), "ConditionalCheckFailedException") {
		t.Fatalf("conditional PutItem on an existing item: %s %s, want 400 ConditionalCheckFailedException", resp.Status, body)
	}
	if !strings.Contains(string(body), `"Item"`) || !strings.Contains(string(body), `"old"`) {
		t.Fatalf("moto did not return the old item with the failed condition: %s", body)
	}

	pid := m.proc.cmd.Process.Pid
	m.Close()
	waitDead(t, pid, 5*time.Second)
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
}

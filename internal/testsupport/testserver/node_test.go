package testserver

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// apiClient sends the tests' requests to the servers. probeClient's 1 s
// is for readiness probes: an emulator under load (moto, in Python, with
// the rest of the suite and other CPU-bound processes beside it) once took
// longer to create a table.
var apiClient = &http.Client{
	Timeout:   30 * time.Second,
	Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true},
}

// awsJSON posts an AWS JSON-protocol request (no signature needed by the
// emulators beyond a plausible Authorization header).
func awsJSON(t *testing.T, endpoint, target, body string) map[string]any {
	t.Helper()
	req, _ := http.NewRequest("POST", endpoint+"/", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/x-amz-json-1.0")
	req.Header.Set("X-Amz-Target", target)
	req.Header.Set("X-Amz-Date", time.Now().UTC().Format("20060102T150405Z"))
	req.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential=test/20200101/us-east-1/dynamodb/aws4_request, SignedHeaders=host;x-amz-date, Signature=0")
	resp, err := apiClient.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", target, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("%s: %s: %s", target, resp.Status, b)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v: %s", target, err, b)
	}
	return m
}

func TestDynalite(t *testing.T) {
	t.Parallel()
	n := timed(t, "dynalite", StartDynalite)
	defer n.Close()
	if !strings.HasPrefix(n.Endpoint, "http://127.0.0.1:") {
		t.Fatalf("Endpoint = %q", n.Endpoint)
	}
	assertLoopbackOnly(t, portOf(t, n.Endpoint))
	awsJSON(t, n.Endpoint, "DynamoDB_20120810.CreateTable", `{"TableName":"tbl",
		"AttributeDefinitions":[{"AttributeName":"k","AttributeType":"S"}],
		"KeySchema":[{"AttributeName":"k","KeyType":"HASH"}],"BillingMode":"PAY_PER_REQUEST"}`)
	// --createTableMs 0: the table is ACTIVE at once.
	d := awsJSON(t, n.Endpoint, "DynamoDB_20120810.DescribeTable", `{"TableName":"tbl"}`)
	if st := d["Table"].(map[string]any)["TableStatus"]; st != "ACTIVE" {
		t.Fatalf("TableStatus = %v", st)
	}
	awsJSON(t, n.Endpoint, "DynamoDB_20120810.PutItem", `{"TableName":"tbl","Item":{"k":{"S":"x"}},
		"ConditionExpression":"attribute_not_exists(k)"}`)
	pid := n.proc.cmd.Process.Pid
	n.Close()
	waitDead(t, pid, time.Second)
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestFauxqs(t *testing.T) {
	t.Parallel()
	n := timed(t, "fauxqs", StartFauxqs)
	defer n.Close()
	// fauxqs's own CLI binds 0.0.0.0; ours must not.
	assertLoopbackOnly(t, portOf(t, n.Endpoint))
	q := awsJSON(t, n.Endpoint, "AmazonSQS.CreateQueue", `{"QueueName":"q"}`)
	url, _ := q["QueueUrl"].(string)
	if !strings.Contains(url, "/q") {
		t.Fatalf("QueueUrl = %q", url)
	}
	awsJSON(t, n.Endpoint, "AmazonSQS.SendMessage", `{"QueueUrl":"`+url+`","MessageBody":"hello"}`)
	r := awsJSON(t, n.Endpoint, "AmazonSQS.ReceiveMessage", `{"QueueUrl":"`+url+`","MaxNumberOfMessages":1}`)
	msgs, _ := r["Messages"].([]any)
	if len(msgs) != 1 || msgs[0].(map[string]any)["Body"] != "hello" {
		t.Fatalf("ReceiveMessage = %v", r)
	}
	pid := n.proc.cmd.Process.Pid
	n.Close()
	waitDead(t, pid, time.Second)
}

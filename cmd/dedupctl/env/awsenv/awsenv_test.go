package awsenv_test

import (
	"context"
	"errors"
	"testing"

	"github.com/watermill-dedup/watermill-dedup/cmd/dedupctl/env/awsenv"
)

// clearAWSEnv unsets every variable LoadAWS looks at.
func clearAWSEnv(t *testing.T) {
	for _, v := range []string{"AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_SQS", "AWS_ENDPOINT_URL_SNS", "AWS_ENDPOINT_URL_DYNAMODB",
		"AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
		"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN"} {
		t.Setenv(v, "")
	}
	// Tests touch loopback addresses only: no EC2 instance metadata lookup.
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("AWS_CONFIG_FILE", t.TempDir()+"/none")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", t.TempDir()+"/none")
}

func TestLoadAWSLocalConveniences(t *testing.T) {
	ctx := context.Background()
	clearAWSEnv(t)
	t.Setenv("AWS_ENDPOINT_URL", "http://localhost:4566")
	t.Setenv("AWS_ENDPOINT_URL_DYNAMODB", "http://127.0.0.1:4567")
	a, err := awsenv.LoadAWS(ctx, "sqs", "sns", "dynamodb")
	if err != nil {
		t.Fatal(err)
	}
	if !a.Local || a.Config.Region != "us-east-1" {
		t.Errorf("local: %v, region %q", a.Local, a.Config.Region)
	}
	if a.Endpoint("sqs") != "http://localhost:4566" || a.Endpoint("dynamodb") != "http://127.0.0.1:4567" {
		t.Errorf("endpoints: sqs %q, dynamodb %q", a.Endpoint("sqs"), a.Endpoint("dynamodb"))
	}
	creds, err := a.Config.Credentials.Retrieve(ctx)
	if err != nil || creds.AccessKeyID != "test" {
		t.Errorf("credentials %+v, %v", creds, err)
	}

	// A region and keys that are set are kept.
	t.Setenv("AWS_REGION", "eu-west-1")
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "secret")
	a, err = awsenv.LoadAWS(ctx, "sqs")
	if err != nil {
		t.Fatal(err)
	}
	creds, err = a.Config.Credentials.Retrieve(ctx)
	if a.Config.Region != "eu-west-1" || err != nil || creds.AccessKeyID != "AKIAEXAMPLE" {
		t.Errorf("region %q, credentials %+v, %v", a.Config.Region, creds, err)
	}
}

func TestLoadAWSRemote(t *testing.T) {
	ctx := context.Background()
	clearAWSEnv(t)
	// No endpoint and no region: AWS, but where?
	if _, err := awsenv.LoadAWS(ctx, "sqs"); err == nil {
		t.Error("LoadAWS without a region or an endpoint succeeded")
	}
	// An endpoint that is not on this machine is not an emulator: no
	// default region, no made-up credentials.
	t.Setenv("AWS_ENDPOINT_URL", "https://sqs.example.com")
	t.Setenv("AWS_REGION", "sa-east-1")
	a, err := awsenv.LoadAWS(ctx, "sqs")
	if err != nil {
		t.Fatal(err)
	}
	if a.Local {
		t.Error("a remote endpoint counts as local")
	}
	if _, err := a.Config.Credentials.Retrieve(ctx); err == nil {
		t.Error("credentials were made up for a remote endpoint")
	}
	// One local service and one remote: not local.
	t.Setenv("AWS_ENDPOINT_URL_SQS", "http://127.0.0.1:4566")
	if a, err := awsenv.LoadAWS(ctx, "sqs", "sns"); err != nil || a.Local {
		t.Errorf("mixed endpoints: local %v, %v", a != nil && a.Local, err)
	}
}

func TestPingNamesEndpointAndHint(t *testing.T) {
	clearAWSEnv(t)
	t.Setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
	a, err := awsenv.LoadAWS(context.Background(), "dynamodb")
	if err != nil {
		t.Fatal(err)
	}
	err = a.PingDynamoDB(context.Background())
	var ue *awsenv.UnreachableError
	if !errors.As(err, &ue) || ue.Service != "dynamodb" || ue.Endpoint != "http://127.0.0.1:1" || ue.Hint != awsenv.DynaliteHint {
		t.Errorf("ping dynamodb: %v", err)
	}
}

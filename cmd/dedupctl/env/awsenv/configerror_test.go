package awsenv_test

import (
	"context"
	"errors"
	"testing"

	"github.com/watermill-dedup/watermill-dedup/cmd/dedupctl/env/awsenv"
)

// TestCredentialsFailureIsNotUnreachable: with a region but no
// credentials, the ping never leaves; it is a *ConfigError about the
// credentials, not "dynamodb does not answer at AWS". No region is a
// *ConfigError too.
func TestCredentialsFailureIsNotUnreachable(t *testing.T) {
	clearAWSEnv(t)
	t.Setenv("AWS_REGION", "us-east-1")
	a, err := awsenv.LoadAWS(context.Background(), "dynamodb")
	if err != nil {
		t.Fatal(err)
	}
	err = a.PingDynamoDB(context.Background())
	var ce *awsenv.ConfigError
	var ue *awsenv.UnreachableError
	if !errors.As(err, &ce) || ce.What != "credentials" || errors.As(err, &ue) {
		t.Errorf("ping without credentials: %v (%T), want a *ConfigError about credentials", err, err)
	}

	clearAWSEnv(t)
	_, err = awsenv.LoadAWS(context.Background(), "dynamodb")
	if !errors.As(err, &ce) || ce.What != "region" {
		t.Errorf("no region: %v, want a *ConfigError about the region", err)
	}
}

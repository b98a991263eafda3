package lab

import (
	"context"
	"errors"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"
)

// A function error (lambdadedup returns ErrBatchFailed when every record
// of a batch failed, e.g. when each is a copy whose key another
// environment holds) fails the whole batch, as an SQS event source mapping
// treats it: every record comes back after its visibility timeout. It is
// not an error of the run.
func TestInvokeBatchFunctionErrorFailsEveryRecord(t *testing.T) {
	fn := lambda.NewHandler(func(context.Context, events.SQSEvent) (events.SQSEventResponse, error) {
		return events.SQSEventResponse{}, errors.New("every record of the batch failed")
	})
	batch := []events.SQSMessage{{MessageId: "a"}, {MessageId: "b"}}
	failed, err := invokeBatch(context.Background(), fn, batch)
	if err != nil {
		t.Fatalf("invokeBatch: %v, want the batch's records failed and no error", err)
	}
	if !failed["a"] || !failed["b"] || len(failed) != 2 {
		t.Fatalf("failed = %v, want both records", failed)
	}
}

package dynamo

import (
	"errors"
	"fmt"

	"github.com/watermill-dedup/watermill-dedup/dedup"
)

var (
	// ErrNoClient: New was given a Config without a Client (nil, or a nil
	// *dynamodb.Client). Validate reports it too.
	ErrNoClient = errors.New("dynamo: Config.Client is required")

	// ErrInvalidKey: the key cannot be stored in a DynamoDB partition key
	// (it is empty or not valid UTF-8). Permanent; nothing was written.
	ErrInvalidKey = errors.New("dynamo: invalid key")

	// ErrResultTooLarge: Complete was given a result that would push the
	// item past DynamoDB's 400 KB item limit (see Store.MaxResultSize).
	// Permanent for that result; the record is left unchanged (still
	// in_progress), nothing is truncated. It matches dedup.ErrResultTooLarge,
	// on which the dedup middleware completes the record without the result
	// (the effect stays recorded; only its replay is lost, and logged).
	ErrResultTooLarge = fmt.Errorf("dynamo: result too large for a DynamoDB item: %w", dedup.ErrResultTooLarge)

	// ErrMalformedRecord: the table holds an item under the key that this
	// store did not write or cannot read (missing or mistyped attributes,
	// unknown state). Claim refuses to decide rather than guess; fix or
	// delete the item.
	ErrMalformedRecord = errors.New("dynamo: malformed record")

	// ErrContended: Claim's condition failed, but the record had changed
	// again before it could be read, several times in a row. Only happens on
	// servers that do not return the old item with a failed condition.
	// Retryable.
	ErrContended = errors.New("dynamo: record changed during claim, try again")
)

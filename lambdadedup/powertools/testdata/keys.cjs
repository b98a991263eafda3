// Computes idempotency keys with the real @aws-lambda-powertools/idempotency
// (TypeScript), for the Go tests of lambdadedup/powertools: reads cases as
// JSON on stdin, writes their keys as JSON on stdout. Run by the Go test
// with NODE_PATH set to the repository's tools/node_modules:
//
//   NODE_PATH=tools/node_modules node keys.cjs < cases.json
//
// A case: {"name", "event" (JSON text), "eventKeyJmesPath",
// "payloadValidationJmesPath", "hashFunction", "keyPrefix"}. Its answer:
// {"name", "key" (the record's partition key, or null when Powertools runs
// the event without idempotency), "validation", "missing" (Powertools'
// isMissingIdempotencyKey of the selection), "error"}.
'use strict';
const { IdempotencyConfig } = require('@aws-lambda-powertools/idempotency');
const { DynamoDBPersistenceLayer } = require('@aws-lambda-powertools/idempotency/dynamodb');
const { BasePersistenceLayer } = require('@aws-lambda-powertools/idempotency/persistence');
const { search } = require('@aws-lambda-powertools/jmespath');

const input = JSON.parse(require('node:fs').readFileSync(0, 'utf8'));
const out = input.map((c) => {
  const answer = { name: c.name };
  try {
    const config = new IdempotencyConfig({
      eventKeyJmesPath: c.eventKeyJmesPath || '',
      payloadValidationJmesPath: c.payloadValidationJmesPath || undefined,
      hashFunction: c.hashFunction || undefined,
    });
    const layer = new DynamoDBPersistenceLayer({ tableName: 'unused', clientConfig: { region: 'us-east-1' } });
    layer.configure({ config, keyPrefix: c.keyPrefix });
    const event = JSON.parse(c.event);
    const selection = c.eventKeyJmesPath
      ? search(c.eventKeyJmesPath, event, config.jmesPathOptions)
      : event;
    answer.missing = BasePersistenceLayer.isMissingIdempotencyKey(selection);
    // IdempotencyHandler.shouldSkipIdempotency: a null selection runs the
    // function without idempotency.
    answer.key = selection === null || selection === undefined ? null : layer.getHashedIdempotencyKey(event);
    answer.validation = layer.getHashedPayload(event);
  } catch (e) {
    answer.error = String(e && e.message || e);
  }
  return answer;
});
process.stdout.write(JSON.stringify(out, null, 1) + '\n');

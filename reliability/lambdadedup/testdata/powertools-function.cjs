// A Powertools for AWS Lambda (TypeScript) function, run by Node for the
// Go tests of reliability/lambdadedup: an SQS record handler made
// idempotent with @aws-lambda-powertools/idempotency's makeIdempotent, as
// in Powertools' batch processing guide, on the DynamoDB endpoint the
// test gives. Its effect adds 1 to the order's charge count in a charges
// table; it returns {"charged": <order_id>, "by": "typescript"}.
//
// Environment: DYNAMO_ENDPOINT, TABLE (the idempotency records), CHARGES
// (the charges table), AWS_LAMBDA_FUNCTION_NAME (the key prefix),
// EVENT_KEY_JMESPATH. Commands, one JSON object a line on stdin; one
// answer a line on stdout, in order:
//
//   {"op":"process","record":{...},"remainingMs":30000,"fail":false}
//     -> {"result":...} or {"error":"<error name>: <message>"}
//   {"op":"claim","record":{...},"remainingMs":1500}
//     the in-progress record of an invocation that then dies (saveInProgress)
//     -> {} or {"error":...}
//   {"op":"run","records":[...],"concurrency":8,"remainingMs":30000}
//     processes every record, retrying one in progress elsewhere until it is
//     done (as SQS would bring it back) -> {"retries":n,"errors":[...]}
//   {"op":"key","record":{...}} -> {"key":"<prefix>#<hash>"}
'use strict';
process.env.AWS_REGION ||= 'us-east-1';
const readline = require('node:readline');
const { DynamoDBClient, UpdateItemCommand } = require('@aws-sdk/client-dynamodb');
const { IdempotencyConfig, makeIdempotent } = require('@aws-lambda-powertools/idempotency');
const { DynamoDBPersistenceLayer } = require('@aws-lambda-powertools/idempotency/dynamodb');

const client = new DynamoDBClient({
  endpoint: process.env.DYNAMO_ENDPOINT,
  region: 'us-east-1',
  credentials: { accessKeyId: 'test', secretAccessKey: 'test' },
  maxAttempts: 5,
});
const persistenceStore = new DynamoDBPersistenceLayer({ tableName: process.env.TABLE, awsSdkV3Client: client });
const config = new IdempotencyConfig({ eventKeyJmesPath: process.env.EVENT_KEY_JMESPATH, expiresAfterSeconds: 3600 });

let failNext = false;
const recordHandler = async (record) => {
  const order = JSON.parse(record.body).order_id;
  if (failNext) throw new Error('handler failed');
  await client.send(new UpdateItemCommand({
    TableName: process.env.CHARGES,
    Key: { order: { S: order } },
    UpdateExpression: 'ADD #n :one, #ts :one',
    ExpressionAttributeNames: { '#n': 'count', '#ts': 'typescript' },
    ExpressionAttributeValues: { ':one': { N: '1' } },
  }));
  return { charged: order, by: 'typescript' };
};
const processIdempotently = makeIdempotent(recordHandler, { persistenceStore, config });

const context = (ms) => ({ getRemainingTimeInMillis: () => ms });

async function processOne(record, remainingMs) {
  config.registerLambdaContext(context(remainingMs));
  return processIdempotently(record);
}

async function run(cmd) {
  switch (cmd.op) {
    case 'process': {
      failNext = !!cmd.fail;
      try {
        return { result: (await processOne(cmd.record, cmd.remainingMs || 30000)) ?? null };
      } finally {
        failNext = false;
      }
    }
    case 'claim': {
      persistenceStore.configure({ config });
      await persistenceStore.saveInProgress(cmd.record, cmd.remainingMs);
      return {};
    }
    case 'key': {
      persistenceStore.configure({ config });
      return { key: persistenceStore.getHashedIdempotencyKey(cmd.record) };
    }
    case 'run': {
      const stats = { retries: 0, errors: [] };
      let next = 0;
      const worker = async () => {
        while (next < cmd.records.length) {
          const record = cmd.records[next++];
          for (let attempt = 0; ; attempt++) {
            try {
              await processOne(record, cmd.remainingMs || 30000);
              break;
            } catch (e) {
              // In progress elsewhere (ours or Powertools'), or any other
              // failure: SQS would bring the record back; try again shortly.
              if (attempt < 500) {
                stats.retries++;
                if (e.name !== 'IdempotencyAlreadyInProgressError') stats.otherRetries = (stats.otherRetries || 0) + 1;
                await new Promise((r) => setTimeout(r, 20));
                continue;
              }
              stats.errors.push(`${e.name}: ${e.message}`);
              break;
            }
          }
        }
      };
      await Promise.all(Array.from({ length: cmd.concurrency || 8 }, worker));
      return stats;
    }
  }
  throw new Error(`unknown op ${cmd.op}`);
}

const rl = readline.createInterface({ input: process.stdin });
let queue = Promise.resolve();
rl.on('line', (line) => {
  queue = queue.then(async () => {
    let answer;
    try {
      answer = await run(JSON.parse(line));
    } catch (e) {
      answer = { error: `${e.name}: ${e.message}` };
    }
    process.stdout.write(JSON.stringify(answer) + '\n');
  });
});

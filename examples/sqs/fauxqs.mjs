// Starts the fauxqs SQS/SNS emulator (installed by `npm ci --prefix tools`)
// on 127.0.0.1 only, port FAUXQS_PORT (default 4566), in memory. fauxqs's
// own CLI listens on every interface; this is the same app, loopback only.
//
//   node examples/sqs/fauxqs.mjs
//   AWS_ENDPOINT_URL=http://127.0.0.1:4566 go run ./examples/sqs
const { buildApp } = await import(new URL("../../tools/node_modules/fauxqs/dist/app.js", import.meta.url));
const port = Number(process.env.FAUXQS_PORT || 4566);
const app = buildApp({ logger: process.env.FAUXQS_LOGGER === "true" });
const address = await app.listen({ port, host: "127.0.0.1" });
console.log(`fauxqs (SQS, SNS) listening at ${address}; Ctrl-C to stop`);
for (const sig of ["SIGINT", "SIGTERM"]) process.on(sig, () => app.close().then(() => process.exit(0)));

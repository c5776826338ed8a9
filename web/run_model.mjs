// Runs one ONNX model on onnxruntime-web's WASM backend in Node.js, for `onnax validate --web`.
// Reads a JSON request on stdin: {"model": PATH, "inputs": {NAME: {dtype, shape, data}}} with
// data the base64 of the little-endian array bytes; writes {"outputs": {...}} in the same
// encoding, or {"error": MESSAGE} with exit code 1.
import { readFileSync } from "node:fs";

import * as ort from "onnxruntime-web";

import { decode, encode } from "./tensors.mjs";

async function main() {
  const request = JSON.parse(readFileSync(0, "utf8"));
  // One thread: deterministic, and no worker threads to tear down in Node.
  ort.env.wasm.numThreads = 1;
  ort.env.logLevel = "error";
  const session = await ort.InferenceSession.create(readFileSync(request.model), {
    executionProviders: ["wasm"],
  });
  const feeds = {};
  for (const [name, spec] of Object.entries(request.inputs)) feeds[name] = decode(ort, spec);
  const results = await session.run(feeds);
  const outputs = {};
  for (const name of session.outputNames) outputs[name] = encode(results[name]);
  process.stdout.write(JSON.stringify({ outputs, version: ort.env.versions?.web ?? "unknown" }));
}

main().catch((err) => {
  process.stdout.write(JSON.stringify({ error: String(err && err.message ? err.message : err) }));
  process.exit(1);
});

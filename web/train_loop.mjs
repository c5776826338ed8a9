// Trains with an onnax training step on onnxruntime-web's WASM backend in Node.js, the loop a
// web page would run: the initial-state model (onnax train-step --init) gives the first
// state, then every step's fed-back outputs become the next step's inputs.
// Reads a JSON request on stdin: {"step": PATH, "init": PATH, "feedback": [[INPUT, OUTPUT], ...],
// "batches": [{NAME: {dtype, shape, data}}, ...], "steps": N, "loss": NAME}, arrays as in
// run_model.mjs; writes {"losses": [...], "state": {NAME: array}}, or {"error": MESSAGE}.
import { readFileSync } from "node:fs";

import * as ort from "onnxruntime-web";

import { decode, encode } from "./tensors.mjs";

async function main() {
  const request = JSON.parse(readFileSync(0, "utf8"));
  ort.env.wasm.numThreads = 1;
  ort.env.logLevel = "error";
  const options = { executionProviders: ["wasm"] };
  const init = await ort.InferenceSession.create(readFileSync(request.init), options);
  const state = await init.run({});
  const step = await ort.InferenceSession.create(readFileSync(request.step), options);
  const batches = request.batches.map((b) => Object.fromEntries(Object.entries(b).map(([k, v]) => [k, decode(ort, v)])));
  const losses = [];
  for (let i = 0; i < request.steps; ++i) {
    const feeds = { ...batches[i % batches.length] };
    for (const name of step.inputNames) if (name in state) feeds[name] = state[name];
    const results = await step.run(feeds);
    losses.push(Number(results[request.loss].data[0]));
    for (const [input, output] of request.feedback) if (output !== null) state[input] = results[output];
  }
  const out = {};
  for (const [name, tensor] of Object.entries(state)) out[name] = encode(tensor);
  process.stdout.write(JSON.stringify({ losses, state: out }));
}

main().catch((err) => {
  process.stdout.write(JSON.stringify({ error: String(err && err.message ? err.message : err) }));
  process.exit(1);
});

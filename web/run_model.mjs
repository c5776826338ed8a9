// Runs one ONNX model on onnxruntime-web's WASM backend in Node.js, for `onnax validate --web`.
// Reads a JSON request on stdin: {"model": PATH, "inputs": {NAME: {dtype, shape, data}}} with
// data the base64 of the little-endian array bytes; writes {"outputs": {...}} in the same
// encoding, or {"error": MESSAGE} with exit code 1.
import { readFileSync } from "node:fs";

import * as ort from "onnxruntime-web";

const ARRAYS = {
  float32: Float32Array,
  float64: Float64Array,
  int8: Int8Array,
  uint8: Uint8Array,
  int16: Int16Array,
  uint16: Uint16Array,
  int32: Int32Array,
  uint32: Uint32Array,
  int64: BigInt64Array,
  uint64: BigUint64Array,
  bool: Uint8Array,
};

function decode(spec) {
  const TypedArray = ARRAYS[spec.dtype];
  if (!TypedArray) throw new Error(`dtype ${spec.dtype} has no onnxruntime-web tensor type`);
  const bytes = Buffer.from(spec.data, "base64");
  const copy = new Uint8Array(bytes); // aligned copy
  return new ort.Tensor(spec.dtype, new TypedArray(copy.buffer, 0, copy.byteLength / TypedArray.BYTES_PER_ELEMENT), spec.shape);
}

function encode(tensor) {
  const data = tensor.data;
  const bytes = Buffer.from(data.buffer, data.byteOffset, data.byteLength);
  return { dtype: tensor.type, shape: Array.from(tensor.dims), data: bytes.toString("base64") };
}

async function main() {
  const request = JSON.parse(readFileSync(0, "utf8"));
  // One thread: deterministic, and no worker threads to tear down in Node.
  ort.env.wasm.numThreads = 1;
  ort.env.logLevel = "error";
  const session = await ort.InferenceSession.create(readFileSync(request.model), {
    executionProviders: ["wasm"],
  });
  const feeds = {};
  for (const [name, spec] of Object.entries(request.inputs)) feeds[name] = decode(spec);
  const results = await session.run(feeds);
  const outputs = {};
  for (const name of session.outputNames) outputs[name] = encode(results[name]);
  process.stdout.write(JSON.stringify({ outputs, version: ort.env.versions?.web ?? "unknown" }));
}

main().catch((err) => {
  process.stdout.write(JSON.stringify({ error: String(err && err.message ? err.message : err) }));
  process.exit(1);
});

// Arrays across the JSON boundary: {dtype, shape, data} with data the base64 of the
// little-endian array bytes, to and from onnxruntime-web tensors.
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

export function decode(ort, spec) {
  const TypedArray = ARRAYS[spec.dtype];
  if (!TypedArray) throw new Error(`dtype ${spec.dtype} has no onnxruntime-web tensor type`);
  const bytes = Buffer.from(spec.data, "base64");
  const copy = new Uint8Array(bytes); // aligned copy
  return new ort.Tensor(spec.dtype, new TypedArray(copy.buffer, 0, copy.byteLength / TypedArray.BYTES_PER_ELEMENT), spec.shape);
}

export function encode(tensor) {
  const data = tensor.data;
  const bytes = Buffer.from(data.buffer, data.byteOffset, data.byteLength);
  return { dtype: tensor.type, shape: Array.from(tensor.dims), data: bytes.toString("base64") };
}

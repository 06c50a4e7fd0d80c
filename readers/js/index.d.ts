// Type declarations for qformat-reader (hand-written; the sources are JavaScript with JSDoc).

/** A qformat error: `code` is one of the stable codes of SPEC.md §16. */
export class QFormatError extends Error {
  readonly code: string;
  readonly category: "malformed" | "invalid" | "unsupported" | "usage";
  readonly tensor: string | null;
  field: string | null;
}

/** Random access to a file's bytes (synchronous). */
export interface ByteSource {
  readonly size: number;
  read(offset: number, length: number): Uint8Array;
}

/** A decoded tensor. */
export interface Tensor {
  /** Logical dtype ("float32", "float16", "bfloat16") of a qformat tensor, or the safetensors dtype of a plain tensor. */
  dtype: string;
  shape: number[];
  /** float32: the values; float16 and bfloat16: their bit patterns; plain tensors: their stored little-endian bytes. */
  data: Float32Array | Uint16Array | Uint8Array;
  /** True for a logical (qformat) tensor, false for a plain one. */
  quantized: boolean;
}

/** An opened file: the container is checked and the qformat object interpreted. */
export class QFile {
  /** `verify`: check a 1.2 file's digests (SPEC.md §3.8) of each tensor's stored bytes before it is first read. */
  constructor(src: ByteSource, opts?: { verify?: boolean; sha256?: (bytes: Uint8Array) => string });
  /** Logical and plain tensor names, sorted by code point (components are not listed). */
  keys(): string[];
  /** `__metadata__` without the `qformat` member. */
  metadata(): Record<string, string> | null;
  fileOrder(): string[];
  /** Every problem found without decoding payload (file scope, then per tensor). */
  problems(): QFormatError[];
  /** The descriptor of a logical tensor as JSON (null for a plain tensor). */
  descriptor(name: string): Record<string, unknown> | null;
  isQuantized(name: string): boolean;
  shape(name: string): number[];
  /** The whole tensor, decoded to its logical dtype (plain tensors: as stored). */
  getTensor(name: string): Tensor;
  /** Rows [lo, hi) along axis 0, decoded (every value equals the whole tensor's, SPEC.md §8.4). */
  getSlice(name: string, rows: [number, number]): Tensor;
  /** Any box: one [lo, hi) per axis (default: everything). */
  read(name: string, box?: [number, number][] | null): Tensor;
  /** Every tensor, decoded; throws the file's first problem (a reader's behaviour, SPEC.md §1.4). */
  loadAll(): Map<string, Tensor>;
}

/** Open a file held in memory (browser or Node). */
export function openFile(bytes: ArrayBuffer | ArrayBufferView, opts?: { verify?: boolean; sha256?: (bytes: Uint8Array) => string }): QFile;
export function openSource(src: ByteSource): QFile;
export function memorySource(bytes: ArrayBuffer | ArrayBufferView): ByteSource;
/** Every problem of a file, as a checker reports them (SPEC.md §12); `digests`: also verify a 1.2 file's digests (§3.8). */
export function check(input: ArrayBuffer | ArrayBufferView | ByteSource,
                      opts?: { strict?: boolean; digests?: boolean; sha256?: (bytes: Uint8Array) => string }): QFormatError[];
/** SHA-256 (FIPS 180-4) of `bytes` as 64 lower-case hexadecimal digits: portable and synchronous. */
export function sha256Hex(bytes: Uint8Array): string;

/** Encode tensors as a plain safetensors file (logical dtypes map to F32, F16, BF16). */
export function encodeSafetensors(
  tensors: Iterable<[string, { dtype: string; shape: (number | bigint)[]; data: ArrayBufferView }]>,
  metadata?: Record<string, string> | null,
): Uint8Array;

/** Strict JSON as qformat requires (duplicate members, exact integers, depth, lone surrogates). */
export class JsonError extends Error {
  readonly kind: "depth" | "duplicate" | "syntax" | "surrogate";
}
export function parseStrict(text: string, opts?: { maxDepth?: number; header?: boolean }): { value: unknown; end: number };

/** binary32 value -> binary16 / bfloat16 bits (round to nearest even, SPEC.md §10.3). */
export function f32ToF16Bits(x: number): number;
export function f32ToBf16Bits(x: number): number;
export function f16ToF32(bits: number): number;
export function bf16ToF32(bits: number): number;
/** The binary32 value of every code of a float element format (SPEC.md §6.3). */
export function floatLut(format: string): Float32Array;

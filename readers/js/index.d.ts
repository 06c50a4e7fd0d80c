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

/** Random access to a file's bytes that arrive later (a Blob, a URL); `bytesFetched` counts what read() produced. */
export interface AsyncByteSource {
  readonly size: number;
  read(offset: number, length: number): Promise<Uint8Array>;
  readonly bytesFetched: number;
}

/** The synchronous view of the ranges fetched so far through an AsyncByteSource (what the decoder reads). */
export class RangeCache implements ByteSource {
  constructor(size: number);
  readonly size: number;
  /** `ranges`: the [begin, end) ranges the chunk was fetched for, found by their starts in constant time; without, the chunk is searched (for a few: the probe, the header). */
  add(start: number, bytes: Uint8Array, ranges?: [number, number][]): void;
  has(offset: number, length: number): boolean;
  read(offset: number, length: number): Uint8Array;
  release(keep: number): void;
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
/** libqformat as WebAssembly (src/wasm.js): load it (synchronously; a browser's main thread: initWasmAsync). */
export function initWasm(source: BufferSource | WebAssembly.Module): boolean;
export function initWasmAsync(source: Response | BufferSource | PromiseLike<Response>): Promise<boolean>;
/** The WebAssembly decode path: true (the default: tensors of at least MIN_VALUES values), "always", or false. Returns the previous setting. */
export function useWasm(on: boolean | "always"): boolean | "always";
export const MIN_VALUES: number;
export function wasmInfo(): { path: "wasm" | "js"; reason: string | null; loaded: boolean; decodes: number };

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

/** An AsyncByteSource over bytes in memory (the in-memory case of the path Blobs and URLs take). */
export function bufferSource(bytes: ArrayBuffer | ArrayBufferView): AsyncByteSource;
/** An AsyncByteSource over a Blob (a browser File): each read is Blob.slice of that range. */
export function blobSource(blob: Blob): AsyncByteSource;

export interface UrlOptions {
  /** The fetch to use (default: globalThis.fetch). */
  fetch?: typeof fetch;
  /** Further attempts after a network error or a 5xx (default 3). */
  retries?: number;
  /** The first retry's delay in ms, doubled for each next one (default 200). */
  backoffMs?: number;
  /** The first request's length (default PROBE_BYTES, 65536): the header length and, usually, the header. */
  probeBytes?: number;
  /** Extra request headers (Authorization, ...); their values are never shown in a message. */
  headers?: Record<string, string>;
  /**
   * Each read's deadline is deadlineMs + its length / minBytesPerSecond (default DEADLINE_MS,
   * 60000; Infinity: none): every try, backoff and the body included. Past it the read fails
   * with REMOTE_UNREACHABLE.
   */
  deadlineMs?: number;
  /** See deadlineMs (default MIN_BYTES_PER_SECOND, 65536). */
  minBytesPerSecond?: number;
  /** Messages show the URL whole (user-info, query, fragment); default: redactUrl's form. */
  showSecrets?: boolean;
}
export const PROBE_BYTES: number;
export const DEADLINE_MS: number;
export const MIN_BYTES_PER_SECOND: number;
/** A URL as messages show it: scheme://host[:port]/path, "?..." where it had a query; no user-info, no fragment. */
export function redactUrl(url: string | URL): string;
/** `text` with every URL in it redacted by redactUrl. */
export function redactUrlsIn(text: string): string;
/** The longest typed array this platform allocates (Node: buffer.constants.MAX_LENGTH; elsewhere 2^53 - 1, unknown). */
export const MAX_ARRAY_LENGTH: number;
/**
 * Open a URL for HTTP range reads (Node 18+, browsers).  Rejects with a QFormatError:
 * REMOTE_HTTP_ERROR, REMOTE_RANGE_IGNORED, REMOTE_RANGE_INVALID, REMOTE_CHANGED,
 * REMOTE_REDIRECT_REFUSED, REMOTE_UNREACHABLE (as do its reads; also past a read's deadline),
 * FILE_UNREADABLE (a size past 2^53 - 1).  A URL's user-info is sent as Basic authorization.
 */
export function urlSource(url: string | URL, opts?: UrlOptions): Promise<AsyncByteSource & {
  /** The URL as given; `shown` is how messages show it. */
  readonly url: string; readonly shown: string; readonly requests: number; readonly etag: string | null; readonly lastModified: string | null; readonly prefix: Uint8Array;
}>;

export interface LazyOptions {
  verify?: boolean;
  sha256?: (bytes: Uint8Array) => string;
  /** At most this many reads in flight at once (default MAX_PARALLEL, 4). */
  parallel?: number;
  /** The longest array a read allocates (stored bytes, decoded values; default MAX_ARRAY_LENGTH): a longer one is refused with SHAPE_UNREPRESENTABLE before anything is fetched. */
  maxArrayLength?: number;
}
export const MAX_PARALLEL: number;
export const PART_BYTES: number;

/** A file read through an AsyncByteSource: QFile's methods; those that decode fetch first, so they are async. */
export class LazyFile {
  readonly src: AsyncByteSource;
  readonly cache: RangeCache;
  /** The synchronous QFile over the fetched ranges. */
  readonly file: QFile;
  readonly size: number;
  /** Bytes read from the source so far (the header included). */
  readonly bytesFetched: number;
  /** The longest array a read allocates (LazyOptions.maxArrayLength). */
  readonly maxArrayLength: number;
  keys(): string[];
  metadata(): Record<string, string> | null;
  fileOrder(): string[];
  problems(): QFormatError[];
  descriptor(name: string): Record<string, unknown> | null;
  isQuantized(name: string): boolean;
  shape(name: string): number[];
  /** The stored tensors (components, or the plain tensor itself) that decoding `name` reads. */
  stored(name: string): string[];
  /** Fetch the stored bytes of `names` (adjacent ranges coalesced, bounded parallelism). */
  fetchTensors(names: string[]): Promise<void>;
  getTensor(name: string): Promise<Tensor>;
  getSlice(name: string, rows: [number, number]): Promise<Tensor>;
  read(name: string, box?: [number, number][] | null): Promise<Tensor>;
  loadAll(): Promise<Map<string, Tensor>>;
  /** check() of the whole file (reads every stored byte). */
  check(opts?: { strict?: boolean; digests?: boolean; sha256?: (bytes: Uint8Array) => string }): Promise<QFormatError[]>;
  /** Drop the fetched tensors' bytes (the header stays); later reads fetch them again. */
  release(): void;
}
/** Open through any AsyncByteSource: the 8-byte length, then the header (if its length passes the container checks), nothing else. */
export function openAsync(src: AsyncByteSource, opts?: LazyOptions): Promise<LazyFile>;
/** Open a URL by HTTP range requests. */
export function openUrl(url: string | URL, opts?: UrlOptions & LazyOptions): Promise<LazyFile>;
/** Open a Blob (a browser File), read lazily by Blob.slice. */
export function openBlob(blob: Blob, opts?: LazyOptions): Promise<LazyFile>;
/** Open bytes in memory by the same path as Blobs and URLs. */
export function openBytesAsync(bytes: ArrayBuffer | ArrayBufferView, opts?: LazyOptions): Promise<LazyFile>;
/** check() through an AsyncByteSource: a refused container gives its one problem; a failed transfer rejects. */
export function checkAsync(src: AsyncByteSource, opts?: { strict?: boolean; digests?: boolean; sha256?: (bytes: Uint8Array) => string }): Promise<QFormatError[]>;
/** Fetch the [start, end) ranges `cache` lacks into it (coalesced, in parts, `parallel` at a time). */
export function fetchRanges(src: AsyncByteSource, cache: RangeCache, ranges: [number, number][], parallel?: number, maxLength?: number): Promise<void>;

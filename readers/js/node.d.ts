// Type declarations of "qformat-reader/node": everything of the core, plus file paths and shards.
import type { ByteSource, QFile, Tensor } from "./index.js";
export * from "./index.js";

/** Open a .safetensors file by path; tensors' bytes are read by range when they are decoded. */
export function openFile(path: string, opts?: { verify?: boolean }): QFile & { close(): void };
/** A ByteSource over a file descriptor. */
export function fileSource(path: string): ByteSource & { close(): void };
/** Every tensor of a file or of a sharded checkpoint (given its *.safetensors.index.json). */
export function loadCheckpoint(path: string): Map<string, Tensor & { storedShape?: bigint[] }>;
/** node:crypto's SHA-256 as 64 lower-case hexadecimal digits. */
export function sha256Node(bytes: Uint8Array): string;
/** Parse and validate a sharded checkpoint index (SPEC.md §14). */
export function readIndex(path: string): { folder: string; weightMap: Map<string, string>; shards: string[] };

// Per-stored-tensor digests (SPEC.md §3.8, spec 1.2): check Q5 of §3.2 on the `digests` member,
// a synchronous SHA-256 (FIPS 180-4) that runs in browsers and Node alike (WebCrypto's digest is
// asynchronous only), and the verification a checker runs (DIGEST_UNSUPPORTED, DIGEST_MISMATCH).
// The Node layer passes node:crypto's SHA-256 instead, which is much faster.

import { error } from "./errors.js";

/** The algorithms this reader implements -> the number of hexadecimal digits of a digest. */
export const DIGEST_DIGITS = new Map([["sha256", 64]]);
/** The first minor version (of major 1) whose files may carry `digests`. */
export const DIGESTS_SINCE_MINOR = 2;

const ALGORITHM_RE = /^[a-z0-9][a-z0-9-]{0,31}$/;
const HEX_RE = /^[0-9a-f]{1,128}$/;

/**
 * Check Q5 (§3.2): why `d` is not a well-formed `digests` member (empty when it is).
 * @param {any} d @returns {string[]}
 */
export function digestsFailures(d) {
  if (!(d instanceof Map)) return ["Q5: 'digests' is not an object"];
  const out = [];
  const extra = [...d.keys()].filter((k) => k !== "algorithm" && k !== "tensors");
  if (extra.length) out.push(`Q5: 'digests' has unknown members ${JSON.stringify(extra)}`);
  const alg = d.get("algorithm");
  if (typeof alg !== "string" || !ALGORITHM_RE.test(alg)) out.push("Q5: 'digests.algorithm' is not a name of [a-z0-9-] (1 to 32 characters)");
  const ts = d.get("tensors");
  if (!(ts instanceof Map)) out.push("Q5: 'digests.tensors' is not an object");
  else if ([...ts.values()].some((v) => typeof v !== "string" || !HEX_RE.test(v))) out.push("Q5: a digest is not 1 to 128 lower-case hexadecimal digits");
  return out;
}

const K = new Uint32Array([
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3,
  0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
  0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208,
  0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
]);

/**
 * SHA-256 of `bytes` as 64 lower-case hexadecimal digits (FIPS 180-4), synchronous and portable.
 * @param {Uint8Array} bytes @returns {string}
 */
export function sha256Hex(bytes) {
  const h = new Uint32Array([0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19]);
  const w = new Int32Array(64);
  const n = bytes.length;
  const total = Math.ceil((n + 9) / 64) * 64;
  const tail = new Uint8Array(total - Math.floor(n / 64) * 64);
  const full = Math.floor(n / 64) * 64;
  tail.set(bytes.subarray(full));
  tail[n - full] = 0x80;
  const bits = n * 8;
  const tv = new DataView(tail.buffer);
  tv.setUint32(tail.length - 8, Math.floor(bits / 2 ** 32));
  tv.setUint32(tail.length - 4, bits >>> 0);
  const block = (/** @type {Uint8Array} */ u, /** @type {number} */ off) => {
    for (let i = 0, o = off; i < 16; i++, o += 4) w[i] = (u[o] << 24) | (u[o + 1] << 16) | (u[o + 2] << 8) | u[o + 3];
    for (let i = 16; i < 64; i++) {
      const a = w[i - 15], b = w[i - 2];
      const s0 = ((a >>> 7) | (a << 25)) ^ ((a >>> 18) | (a << 14)) ^ (a >>> 3);
      const s1 = ((b >>> 17) | (b << 15)) ^ ((b >>> 19) | (b << 13)) ^ (b >>> 10);
      w[i] = (((w[i - 16] + s0) | 0) + ((w[i - 7] + s1) | 0)) | 0;
    }
    let a = h[0] | 0, b = h[1] | 0, c = h[2] | 0, d = h[3] | 0, e = h[4] | 0, f = h[5] | 0, g = h[6] | 0, hh = h[7] | 0;
    for (let i = 0; i < 64; i++) {
      const S1 = ((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7));
      const ch = (e & f) ^ (~e & g);
      const t1 = (((hh + S1) | 0) + ((ch + K[i]) | 0) + w[i]) | 0;
      const S0 = ((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10));
      const maj = (a & b) ^ (a & c) ^ (b & c);
      const t2 = (S0 + maj) | 0;
      hh = g; g = f; f = e; e = (d + t1) | 0; d = c; c = b; b = a; a = (t1 + t2) | 0;
    }
    h[0] = (h[0] + a) | 0; h[1] = (h[1] + b) | 0; h[2] = (h[2] + c) | 0; h[3] = (h[3] + d) | 0;
    h[4] = (h[4] + e) | 0; h[5] = (h[5] + f) | 0; h[6] = (h[6] + g) | 0; h[7] = (h[7] + hh) | 0;
  };
  for (let off = 0; off < full; off += 64) block(bytes, off);
  for (let off = 0; off < tail.length; off += 64) block(tail, off);
  return [...h].map((x) => x.toString(16).padStart(8, "0")).join("");
}

/** @type {WeakMap<Map<string, string>, Map<string, number>>} */
const positions = new WeakMap();

/** Where `name` is listed in `want` (the order problems are reported in), from an index built once. @param {Map<string, string>} want @param {string} name */
function position(want, name) {
  let pos = positions.get(want);
  if (!pos) {
    pos = new Map();
    let i = 0;
    for (const k of want.keys()) pos.set(k, i++);
    positions.set(want, pos);
  }
  return /** @type {number} */ (pos.get(name));
}

/**
 * The digest problems of a file (§3.8): DIGEST_UNSUPPORTED once, or DIGEST_MISMATCH per listed
 * stored tensor that is missing, has a digest of the wrong length, or whose bytes differ.
 * @param {Map<string, any>|null} digests the file's validated `digests` member
 * @param {{entries: Map<string, any>}} header
 * @param {(name: string) => Uint8Array} bytesOf the stored tensor's bytes
 * @param {(stored: string) => string} owner the logical tensor a stored tensor belongs to
 * @param {(bytes: Uint8Array) => string} [hash] SHA-256 as hexadecimal (default: sha256Hex)
 * @param {string[]|null} [names] only these stored tensors
 */
export function digestProblems(digests, header, bytesOf, owner, hash = sha256Hex, names = null) {
  if (digests === null) return [];
  const alg = digests.get("algorithm");
  if (!DIGEST_DIGITS.has(alg)) return [error("DIGEST_UNSUPPORTED", `digest algorithm ${JSON.stringify(alg)} is not one this reader implements (sha256); the digests cannot be verified`, null, "digests.algorithm")];
  const want = /** @type {Map<string, string>} */ (digests.get("tensors"));
  const out = [];
  // `names` (one tensor's few stored tensors) are looked up, not searched for in every listed
  // digest: a reader verifying each of n tensors stays linear in n
  const listed = names === null ? want : new Map(names.filter((n) => want.has(n)).sort((x, y) => position(want, x) - position(want, y)).map((n) => [n, want.get(n)]));
  for (const [stored, exp] of /** @type {Map<string, string>} */ (listed)) {
    const field = `digests.tensors[${JSON.stringify(stored)}]`;
    if (!header.entries.has(stored)) {
      out.push(error("DIGEST_MISMATCH", `'digests' lists ${JSON.stringify(stored)}, which is no stored tensor of the file`, stored, field));
      continue;
    }
    if (exp.length !== DIGEST_DIGITS.get(alg)) {
      out.push(error("DIGEST_MISMATCH", `expected a ${alg} digest of ${DIGEST_DIGITS.get(alg)} digits, found ${exp.length}`, owner(stored), field));
      continue;
    }
    const got = hash(bytesOf(stored));
    if (got !== exp) out.push(error("DIGEST_MISMATCH", `stored tensor ${JSON.stringify(stored)}: its bytes have ${alg} ${got}, the file records ${exp}`, owner(stored), field));
  }
  return out;
}

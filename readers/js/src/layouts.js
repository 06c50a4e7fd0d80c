// Device layouts (SPEC.md §11.3 tinygemm_int4_cuda, §11.4 marlin_dense): what each requires of a
// descriptor, the shape of its codes component, and the exact unpacking of the stored words to
// the logical codes q[n, k] (and, for marlin_dense, of the permuted scale to its natural order).

/** @typedef {import("./descriptor.js").Descriptor} Descriptor */

/** @param {Descriptor} d */
const tiles = (d) => Number(d.layout_parameters.get("inner_k_tiles"));

const SPECS = {
  tinygemm_int4_cuda: {
    bits: [4],
    groupSizes: [32, 64, 128, 256],
    perChannel: false,
    bias: true,
    paramOrder: null,
  },
  marlin_dense: {
    bits: [4, 8],
    groupSizes: [32, 64, 128],
    perChannel: true,
    bias: false,
    paramOrder: [1, 0],
  },
};

/**
 * What a defined device layout requires (SPEC.md §11.3, §11.4).
 * @param {Descriptor} d
 */
export function layoutSpec(d) {
  if (d.layout === "tinygemm_int4_cuda") {
    const t = tiles(d);
    return { ...SPECS.tinygemm_int4_cuda, shapeProblem: (/** @type {number} */ n, /** @type {number} */ k) => (n % 8 || k % (16 * t) ? `with inner_k_tiles ${t} N must be a multiple of 8 and K of ${16 * t}` : null) };
  }
  if (d.layout === "marlin_dense") {
    return { ...SPECS.marlin_dense, shapeProblem: (/** @type {number} */ n, /** @type {number} */ k) => (k % 128 || n % 64 ? "K must be a multiple of 128 and N of 64" : null) };
  }
  throw new Error(`no device layout ${d.layout}`);
}

/** The codes component's shape in a device layout. @param {Descriptor} d @returns {number[]} */
export function deviceShape(d) {
  const [n, k] = d.shape;
  if (d.layout === "tinygemm_int4_cuda") {
    const t = tiles(d);
    return [Math.floor(n / 8), Math.floor(k / (16 * t)), 32, Math.floor(t / 2)];
  }
  return [Math.floor(k / 16), Math.floor((n * 16 * d.codes.element.bits) / 32)];
}

/** @type {Map<number, Int32Array>} */
const permCache = new Map();

/** PERM_b of SPEC.md §11.4. @param {number} bits */
export function marlinPerm(bits) {
  let out = permCache.get(bits);
  if (out) return out;
  const perm = [];
  for (let i = 0; i < 32; i++) {
    const col = Math.floor(i / 4);
    const p1 = [];
    for (const blk of [0, 1]) {
      for (const row of [2 * (i % 4), 2 * (i % 4) + 1, 2 * ((i % 4) + 4), 2 * ((i % 4) + 4) + 1]) p1.push(16 * row + col + 8 * blk);
    }
    for (let j = 0; j < 4; j++) for (const x of p1) perm.push(x + 256 * j);
  }
  const il = bits === 4 ? [0, 2, 4, 6, 1, 3, 5, 7] : [0, 2, 1, 3];
  out = new Int32Array(1024);
  for (let m = 0; m < 1024; m++) out[m] = perm[il.length * Math.floor(m / il.length) + il[m % il.length]];
  permCache.set(bits, out);
  return out;
}

/**
 * The stored words of a device layout -> logical codes q[n, k], row-major [N, K].
 * @param {Descriptor} d @param {(i: number) => number} word  the i-th 32-bit word (row-major), unsigned
 * @returns {Uint8Array}
 */
export function unpackDevice(d, word) {
  const [N, K] = d.shape;
  const q = new Uint8Array(N * K);
  if (d.layout === "tinygemm_int4_cuda") {
    const T = tiles(d);
    const [NT, KO] = [N / 8, K / (16 * T)];
    const W = T / 2;
    let idx = 0;
    for (let nt = 0; nt < NT; nt++) for (let ko = 0; ko < KO; ko++) for (let t = 0; t < 32; t++) for (let w = 0; w < W; w++) {
      const v = word(idx++);
      for (let j = 0; j < 8; j++) {
        const i = j % 4;
        const h = j >> 2;
        const n = 8 * nt + (t >> 2);
        const k = 16 * (ko * T + 2 * w) + 2 * (t % 4) + 8 * (i % 2) + 16 * (i >> 1) + h;
        q[n * K + k] = (v >>> (4 * j)) & 0xf;
      }
    }
    return q;
  }
  const b = d.codes.element.bits;
  const P = 32 / b;
  const mask = (1 << b) - 1;
  const perm = marlinPerm(b);
  const rowLen = 16 * N; // entries of R and A per kt
  const R = new Uint8Array(rowLen);
  for (let kt = 0; kt < K / 16; kt++) {
    for (let x = 0; x < rowLen / P; x++) {
      const v = word(kt * (rowLen / P) + x);
      for (let i = 0; i < P; i++) R[P * x + i] = (v >>> (b * i)) & mask;
    }
    for (let u = 0; u < rowLen / 1024; u++) {
      for (let m = 0; m < 1024; m++) {
        const a = 1024 * u + perm[m]; // A[kt, a] = R[kt, 1024u + m]
        const nt = Math.floor(a / 256);
        const r = (a >> 4) & 15;
        const c = a & 15;
        q[(16 * nt + c) * K + 16 * kt + r] = R[1024 * u + m];
      }
    }
  }
  return q;
}

/**
 * marlin_dense: the stored scale values (row-major) -> natural order (SPEC.md §11.4 "Scales").
 * Other layouts store the scale as is.
 * @param {Descriptor} d @param {Float32Array} stored @returns {Float32Array}
 */
export function scaleToCanonical(d, stored) {
  if (d.layout !== "marlin_dense" || d.scale === null || d.scale.blocks.type !== "grid") return stored;
  const g = d.scale.blocks.size[1];
  const grouped = g !== null && g < d.shape[1];
  const run = grouped ? 64 : 32;
  const sp = new Int32Array(run);
  const single = [0, 1, 8, 9, 16, 17, 24, 25];
  for (let m = 0; m < run; m++) sp[m] = grouped ? 8 * (m % 8) + Math.floor(m / 8) : 2 * Math.floor(m / 8) + single[m % 8];
  const out = new Float32Array(stored.length);
  for (let u = 0; u + run <= stored.length; u += run) for (let m = 0; m < run; m++) out[u + sp[m]] = stored[u + m];
  return out;
}

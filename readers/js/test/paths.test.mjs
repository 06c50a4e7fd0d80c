// The path policy for names read from inside a file (issue 40; qformat/paths.py is the Python
// side): an index's shard names are plain names in the index's folder, and a shard that is a
// link is followed only to a regular file inside that folder's real path, or from a
// huggingface_hub snapshot directly into its own repository's real blobs/ folder.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { encodeSafetensors, loadCheckpoint, readIndex } from "../src/node.js";

const roots = [];
after(() => roots.forEach((r) => rmSync(r, { recursive: true, force: true })));

const shard = (x) => encodeSafetensors([["w", { dtype: "float32", shape: [2], data: Float32Array.of(x, x) }]]);

/** A folder `ck` with an index naming `name` for tensor w, and a folder `outside` beside it holding x.safetensors. */
function layout(name) {
  const root = mkdtempSync(join(tmpdir(), "qformat-js-paths-"));
  roots.push(root);
  mkdirSync(join(root, "ck"));
  mkdirSync(join(root, "outside"));
  writeFileSync(join(root, "outside", "x.safetensors"), shard(7));
  writeFileSync(join(root, "ck", "model.safetensors.index.json"), JSON.stringify({ weight_map: { w: name } }));
  return { root, ck: join(root, "ck"), index: join(root, "ck", "model.safetensors.index.json") };
}

/** A loaded plain float32 tensor's values (plain tensors come as their little-endian bytes). */
const values = (t) => [...new Float32Array(t.data.buffer, t.data.byteOffset, t.data.byteLength / 4)];

const codeOf = (fn) => {
  try {
    fn();
  } catch (e) {
    return e.code;
  }
  return null;
};

for (const name of ["../outside/x.safetensors", "../x.safetensors", "/abs/x.safetensors", "a//b", "", ".", "..", "a\\b", "x\0y"]) {
  test(`a shard named ${JSON.stringify(name)} is INDEX_INVALID`, () => {
    const { index } = layout(name);
    assert.equal(codeOf(() => readIndex(index)), "INDEX_INVALID");
    assert.equal(codeOf(() => loadCheckpoint(index)), "INDEX_INVALID");
  });
}

test("a shard that is a link leaving the index's folder is INDEX_INVALID, and not read", () => {
  const { root, ck, index } = layout("x.safetensors");
  symlinkSync(join(root, "outside", "x.safetensors"), join(ck, "x.safetensors"));
  let err = null;
  try {
    loadCheckpoint(index);
  } catch (e) {
    err = e;
  }
  assert.equal(err?.code, "INDEX_INVALID");
  assert.match(err.message, /x\.safetensors/);
  assert.match(err.message, /outside/);
  assert.equal(codeOf(() => readIndex(index)), "INDEX_INVALID");
});

test("a shard that is a relative link climbing out, a link to a folder, or a folder, is INDEX_INVALID", () => {
  const a = layout("x.safetensors");
  symlinkSync("../outside/x.safetensors", join(a.ck, "x.safetensors"));
  assert.equal(codeOf(() => readIndex(a.index)), "INDEX_INVALID");
  const b = layout("x.safetensors");
  mkdirSync(join(b.ck, "store"));
  symlinkSync("store", join(b.ck, "x.safetensors"));
  assert.equal(codeOf(() => readIndex(b.index)), "INDEX_INVALID");
  const c = layout("x.safetensors");
  mkdirSync(join(c.ck, "x.safetensors"));  // a folder by the shard's name
  assert.equal(codeOf(() => readIndex(c.index)), "INDEX_INVALID");
});

test("a shard linking inside the index's folder is read", () => {
  const { ck, index } = layout("x.safetensors");
  mkdirSync(join(ck, "store"));
  writeFileSync(join(ck, "store", "x.safetensors"), shard(3));
  symlinkSync("store/x.safetensors", join(ck, "x.safetensors"));
  assert.deepEqual(readIndex(index).shards, ["x.safetensors"]);
  assert.deepEqual(values(loadCheckpoint(index).get("w")), [3, 3]);
});

/** A huggingface_hub cache repository whose snapshot `rev` holds the index and a shard, each a link into blobs/. */
function snapshot(blobsOut) {
  const root = mkdtempSync(join(tmpdir(), "qformat-js-hub-"));
  roots.push(root);
  const repo = join(root, "hub", "models--org--m");
  const snap = join(repo, "snapshots", "rev");
  mkdirSync(snap, { recursive: true });
  if (blobsOut) {
    mkdirSync(join(root, "home"));
    symlinkSync(join(root, "home"), join(repo, "blobs"));
  } else {
    mkdirSync(join(repo, "blobs"));
  }
  writeFileSync(join(repo, "blobs", "b1"), JSON.stringify({ weight_map: { w: "x.safetensors" } }));
  writeFileSync(join(repo, "blobs", "b2"), shard(5));
  symlinkSync("../../blobs/b1", join(snap, "model.safetensors.index.json"));
  symlinkSync("../../blobs/b2", join(snap, "x.safetensors"));
  return join(snap, "model.safetensors.index.json");
}

test("a huggingface_hub snapshot's shard links into its own blobs/ are followed", () => {
  const index = snapshot(false);
  assert.deepEqual(values(loadCheckpoint(index).get("w")), [5, 5]);
});

test("a snapshot whose blobs/ is itself a link out of the cache is not followed", () => {
  const index = snapshot(true);
  assert.equal(codeOf(() => readIndex(index)), "INDEX_INVALID");
});

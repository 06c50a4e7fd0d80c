// The JSON Schema of the qformat object (draft 2020-12), evaluated by a small interpreter of
// exactly the keywords that schema uses, with the error reporting of the Python `jsonschema`
// package that the reference implementation uses: `allOf`, `$ref`, `properties` and `items`
// descend and report their sub-errors; `oneOf`, `anyOf` and `not` report one error at the
// instance they apply to; `additionalProperties` and `required` report at the object.  From
// where the failures sit, schemaCode() derives the code of SPEC.md §5.5.

import { SCHEMA } from "./tables.js";

/** @typedef {{path: (string|number)[], validator: string, message: string}} SchemaError */

/** @param {string} ref */
function resolve(ref) {
  if (ref === "#") return SCHEMA;
  const m = /^#\/\$defs\/(.+)$/.exec(ref);
  if (!m) throw new Error(`unsupported $ref ${ref}`);
  return /** @type {any} */ (SCHEMA).$defs[m[1]];
}

/** @param {any} v */
const isNumber = (v) => typeof v === "number" || typeof v === "bigint";

/** @param {any} v @param {string} t */
function hasType(v, t) {
  switch (t) {
    case "object": return v instanceof Map;
    case "array": return Array.isArray(v);
    case "string": return typeof v === "string";
    case "null": return v === null;
    case "boolean": return typeof v === "boolean";
    case "number": return isNumber(v);
    case "integer": return typeof v === "bigint" || (typeof v === "number" && Number.isInteger(v));
    default: throw new Error(`unsupported type ${t}`);
  }
}

/** jsonschema's equality for enum/const: numbers by value, strings exactly, bools apart. */
function equal(/** @type {any} */ a, /** @type {any} */ b) {
  if (typeof b === "string" || typeof a === "string") return a === b;
  if (typeof a === "boolean" || typeof b === "boolean") return a === b;
  if (a === null || b === null) return a === b;
  if (isNumber(a) && isNumber(b)) return a == b; // eslint-disable-line eqeqeq
  return false;
}

/** Length in code points (Python's len). @param {string} s */
const cpLength = (s) => {
  let n = 0;
  for (const _ of s) n++; // eslint-disable-line no-unused-vars
  return n;
};

/**
 * Every error of `inst` against `schema`, jsonschema style.
 * @param {any} inst @param {any} schema @param {(string|number)[]} path @param {SchemaError[]} out
 */
function walk(inst, schema, path, out) {
  if (schema === true) return;
  if (schema === false) {
    out.push({ path, validator: "false", message: "nothing is allowed here" });
    return;
  }
  const add = (/** @type {string} */ validator, /** @type {string} */ message) => out.push({ path, validator, message });
  for (const [kw, arg] of Object.entries(schema)) {
    switch (kw) {
      case "$schema": case "$id": case "title": case "description": case "$defs": case "$comment":
        break;
      case "$ref":
        walk(inst, resolve(arg), path, out);
        break;
      case "type":
        if (!(Array.isArray(arg) ? arg.some((t) => hasType(inst, t)) : hasType(inst, arg))) add("type", `expected type ${arg}`);
        break;
      case "enum":
        if (!arg.some((/** @type {any} */ v) => equal(inst, v))) add("enum", `expected one of ${JSON.stringify(arg)}`);
        break;
      case "const":
        if (!equal(inst, arg)) add("const", `expected ${JSON.stringify(arg)}`);
        break;
      case "minimum":
        if (isNumber(inst) && inst < arg) add("minimum", `below the minimum ${arg}`);
        break;
      case "maximum":
        if (isNumber(inst) && inst > arg) add("maximum", `above the maximum ${arg}`);
        break;
      case "minLength":
        if (typeof inst === "string" && cpLength(inst) < arg) add("minLength", `shorter than ${arg}`);
        break;
      case "maxLength":
        if (typeof inst === "string" && cpLength(inst) > arg) add("maxLength", `longer than ${arg}`);
        break;
      case "pattern":
        if (typeof inst === "string" && !new RegExp(arg, "u").test(inst)) add("pattern", `does not match ${arg}`);
        break;
      case "minItems":
        if (Array.isArray(inst) && inst.length < arg) add("minItems", `fewer than ${arg} items`);
        break;
      case "maxItems":
        if (Array.isArray(inst) && inst.length > arg) add("maxItems", `more than ${arg} items`);
        break;
      case "items":
        if (Array.isArray(inst)) inst.forEach((v, i) => walk(v, arg, [...path, i], out));
        break;
      case "required":
        if (inst instanceof Map) for (const k of arg) if (!inst.has(k)) add("required", `${JSON.stringify(k)} is a required member`);
        break;
      case "properties":
        if (inst instanceof Map) for (const [k, sub] of Object.entries(arg)) if (inst.has(k)) walk(inst.get(k), sub, [...path, k], out);
        break;
      case "additionalProperties":
        if (inst instanceof Map) {
          const known = schema.properties ?? {};
          const extra = [...inst.keys()].filter((k) => !Object.hasOwn(known, k));
          if (arg === false) {
            if (extra.length) add("additionalProperties", `unknown members ${JSON.stringify(extra)}`);
          } else for (const k of extra) walk(inst.get(k), arg, [...path, k], out);
        }
        break;
      case "propertyNames":
        if (inst instanceof Map) for (const k of inst.keys()) walk(k, arg, path, out);
        break;
      case "allOf":
        for (const sub of arg) walk(inst, sub, path, out);
        break;
      case "anyOf":
        if (!arg.some((/** @type {any} */ sub) => valid(inst, sub))) add("anyOf", "matches none of the alternatives");
        break;
      case "oneOf": {
        const k = arg.filter((/** @type {any} */ sub) => valid(inst, sub)).length;
        if (k !== 1) add("oneOf", k === 0 ? "matches none of the alternatives" : "matches more than one alternative");
        break;
      }
      case "not":
        if (valid(inst, arg)) add("not", "must not match");
        break;
      default:
        throw new Error(`unsupported schema keyword ${kw}`);
    }
  }
}

/** @param {any} inst @param {any} schema */
function valid(inst, schema) {
  /** @type {SchemaError[]} */
  const out = [];
  walk(inst, schema, [], out);
  return out.length === 0;
}

/**
 * Errors of `inst` against the schema's definition `defn` (null: the whole qformat object).
 * @param {any} inst @param {string|null} [defn] @returns {SchemaError[]}
 */
export function schemaErrors(inst, defn = null) {
  /** @type {SchemaError[]} */
  const out = [];
  walk(inst, defn === null ? SCHEMA : resolve(`#/$defs/${defn}`), [], out);
  return out;
}

/** @param {SchemaError} e */
export function describe(e) {
  return `at ${e.path.join("/") || "(root)"}: ${e.message}`;
}

const SPECIFIC = /** @type {[string[], string][]} */ ([
  [["dtype"], "DTYPE_INVALID"],
  [["shape"], "SHAPE_INVALID"],
  [["codes", "element"], "ELEMENT_INVALID"],
  [["codes", "packing"], "PACKING_INVALID"],
  [["layout"], "LAYOUT_INVALID"],
]);

/**
 * The code of a descriptor that fails the schema, in a file not newer than the reader (§5.5).
 * @param {SchemaError[]} errs  non-empty
 */
export function schemaCode(errs) {
  const codes = new Set();
  let unknown = false;
  for (const e of errs) {
    if ((e.validator === "additionalProperties" || e.validator === "required") && e.path.length === 0) unknown = true;
    let code = "SCHEMA_VIOLATION";
    if (e.validator !== "additionalProperties") {
      for (const [prefix, c] of SPECIFIC) {
        if (prefix.every((p, i) => e.path[i] === p)) {
          code = c;
          break;
        }
      }
      if (e.path.length >= 2 && ["zero", "scale", "bias"].includes(/** @type {string} */ (e.path[0])) && e.path[1] === "blocks") code = "BLOCKS_INVALID";
    }
    codes.add(code);
  }
  if (unknown || codes.size !== 1) return "SCHEMA_VIOLATION";
  return /** @type {string} */ ([...codes][0]);
}

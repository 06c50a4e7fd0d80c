"""A GGUF model file as a Hugging Face model folder whose weights stay packed.

``qformat convert model.gguf out/`` (the ``hf`` layout; :func:`convert_gguf`) writes a folder
that ``AutoModelForCausalLM.from_pretrained(out)`` and ``AutoTokenizer.from_pretrained(out)``
load, with every GGUF block type kept as it is stored (K-quants included): the weights are the
core's GGUF conversion (SPEC.md Appendix C.11, bit-exact with gguf-py), renamed and reordered
the way transformers' own GGUF loader does it, and nothing is decoded on the way.

Everything model-specific is transformers' own, so the folder loads as
``from_pretrained(..., gguf_file=...)`` would build the model:

* the config from the GGUF hyperparameters and the tokenizer from the GGUF vocabulary
  (``AutoConfig`` / ``AutoTokenizer`` with ``gguf_file``), chat template included;
* the tensor names as ``get_gguf_hf_weights_map`` gives them over the model built on the meta device
  (:func:`gguf_names`: the same map, built once);
* the per-architecture fix-ups of its tensor processors.  A processor that reorders rows
  (llama.cpp's rotary permutation of q/k, undone for ``llama``) is found by running it on the
  row numbers, and applied to the packed components as a move of whole rows, which is exact
  (:func:`qformat.slicing.row_components`); one that reshapes by the real width (Bloom's fused
  q/k/v regrouped per head) is run on every element's number instead and taken when it only
  moves whole rows; one that transposes a 2-D tensor (GPT-2's ``Conv1D`` weights) transposes a
  plain tensor as it is copied and gives a packed one the descriptor of its transpose over the
  same components (:class:`TransposedMove`); a processor that changes values (Gemma's
  ``norm - 1``) is applied to plain tensors as transformers applies it (binary32) and refused
  for a quantized one.

The tokenizer is proven before the folder is moved into place: saved, it must load back with
``AutoTokenizer.from_pretrained(out)`` encoding a probe text as the one built from the GGUF does
(:func:`_same_tokenizer`).  Its files and that proof are made by a forked child while the weights
are planned and written (:class:`_TokenizerJob`; on Linux, from a process running one Python
thread; elsewhere, or with ``QFORMAT_GGUF_TOKENIZER_INLINE=1``, one after the other, the same
files).  tokenizer_config.json also lists the added tokens (``added_tokens_decoder``, which
transformers 5 leaves out), so that loading the folder does not parse tokenizer.json twice
(:func:`_keep_added_tokens`).

The GGUF's key/values and tensor list stay in the weights file's ``__metadata__`` (``gguf`` and
its ``gguf.kv.*`` members, as the single-file conversion records them), and every tensor's move is
checked against qformat's architecture table (:func:`check_table`), which ``qformat export --to
gguf`` applies the other way: an unchanged folder exports to the original GGUF, byte for byte.

What is refused, with a code and nothing written: an architecture transformers' GGUF loader
does not support, or one whose weights it merges or splits on load (the MoE architectures) or
loads through its newer packed path (``CONVERT_UNSUPPORTED``, naming the architecture); a GGUF
without a hyperparameter the config needs, or whose tensors do not fit the model those
hyperparameters describe (``CONVERT_SOURCE_INVALID``, naming the key or tensor); a tokenizer
transformers cannot build (``CONVERT_UNSUPPORTED``).

A GGUF from a stranger: every value transformers reads is checked before a config is built from
it (:mod:`.gguf_hparams`: types, ranges, the block count against the blocks the tensors hold,
the vocabulary against the token embedding), so the model built on the meta device and the name
map are bounded by the tensors the file holds.  What transformers or torch still raises while
building the config, the model, the name map or the generation config is caught there and
refused as ``CONVERT_SOURCE_INVALID`` naming what was being built (:func:`_building`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Iterator, TextIO

import numpy as np

from qformat.convert.relayout import Move, relayout
from qformat.errors import QFormatError, error

from . import gguf_hparams

#: GGUF architectures transformers' GGUF loader merges or splits tensors of (MoE experts, fused
#: layouts): the packed components cannot follow those operations yet.
MERGED_ARCHITECTURES = ("qwen2moe", "qwen3moe", "gpt-oss", "gpt_oss", "minimax-m2", "t5", "t5encoder", "mamba", "lfm2")
#: GGUF architectures whose llama.cpp files transformers' GGUF loader builds a different model
#: from (a hyperparameter it does not read, so a class default), with why: refused by name.
MISREAD_ARCHITECTURES: dict[str, str] = {
    "falcon": "llama.cpp writes its layer norm epsilon as falcon.attention.layer_norm_epsilon, which transformers' GGUF "
              "loader does not read (it maps only layer_norm_rms_epsilon), so it would build FalconConfig's default; and it "
              "does not undo llama.cpp's regrouped query_key_value (the \"jploski\" layout) for more than one KV head",
}
#: The probe row values: far from 0 and fractional, so that a processor changing values is
#: never mistaken for one moving rows.
_PROBE = 1000.5


@dataclass
class Summary:
    """What :func:`convert_gguf` wrote."""

    path: str
    architecture: str
    model_type: str
    model_class: str
    files: list[str] = field(default_factory=list)
    quantized: int = 0
    plain: int = 0
    bytes: int = 0
    permuted: list[str] = field(default_factory=list)  # HF names whose rows were reordered
    left_out: list[str] = field(default_factory=list)  # GGUF tensors transformers does not load either
    side_files: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _kv(described: Any) -> dict[str, Any]:
    from qformat.convert.gguf import METADATA_KEY

    return json.loads(described.metadata[METADATA_KEY]).get("kv", {})


def _kv_value(kv: dict[str, Any], key: str) -> Any:
    v = kv.get(key)
    return v.get("value") if isinstance(v, dict) else None


def _check_architecture(arch: str) -> None:
    import gguf
    from transformers.integrations.gguf.utils import is_gguf_arch_supported
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    if arch in MISREAD_ARCHITECTURES:
        raise error("CONVERT_UNSUPPORTED", f"GGUF architecture {arch!r}: {MISREAD_ARCHITECTURES[arch]}", field="general.architecture")
    if arch in MERGED_ARCHITECTURES or arch.replace("-", "_") in MERGED_ARCHITECTURES:
        raise error("CONVERT_UNSUPPORTED", f"GGUF architecture {arch!r}: transformers merges or splits its tensors when it loads them "
                    "(experts, fused projections), which packed components cannot follow; convert to the gguf layout "
                    "(DST ending in .safetensors) to keep the GGUF names", field="general.architecture")
    if is_gguf_arch_supported(arch):
        raise error("CONVERT_UNSUPPORTED", f"GGUF architecture {arch!r} is loaded by transformers' newer GGUF path, whose "
                    "weight conversions are not mirrored here yet", field="general.architecture")
    named = set(gguf.MODEL_ARCH_NAMES.values())  # gguf-py names the tensors of these
    known = sorted(a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer") and a not in MERGED_ARCHITECTURES
                   and a in named and not is_gguf_arch_supported(a))
    if arch not in known:
        raise error("CONVERT_UNSUPPORTED", f"GGUF architecture {arch!r} is not one transformers' GGUF loader supports "
                    f"(supported here: {', '.join(known)})", field="general.architecture")


def _shapes(described: Any) -> dict[str, tuple[int, ...]]:
    """Every GGUF tensor's shape (NumPy order), quantized and plain, in file order."""
    shapes: dict[str, tuple[int, ...]] = {n: tuple(d["shape"]) for n, d in described.descriptors.items()}
    shapes.update({n: tuple(described.plain.info(n).shape) for n in described.plain})
    return shapes


@contextlib.contextmanager
def _building(what: str, field: str) -> Iterator[None]:
    """The last resort behind :mod:`.gguf_hparams`: an exception transformers or torch raises
    while building ``what`` from values those checks passed becomes CONVERT_SOURCE_INVALID
    naming what was being built, instead of escaping without a code."""
    try:
        yield
    except QFormatError:
        raise
    except Exception as e:  # noqa: BLE001  (whatever transformers raises: ValueError, TypeError, RuntimeError, AssertionError...)
        raise error("CONVERT_SOURCE_INVALID", f"transformers raised {type(e).__name__} while building {what}: {str(e)[:300]}",
                    field=field) from None


def gguf_names(model: Any, processor: Any, arch: str, n_blocks: int) -> dict[str, str]:
    """GGUF tensor name -> the model's parameter name, as transformers' ``get_gguf_hf_weights_map``
    maps them, with gguf-py's name map built once.

    transformers builds gguf-py's ``TensorNameMap`` (every name of ``n_blocks`` blocks) again for
    every module of the model as it recurses into it, which is quadratic in the block count.  The
    same answer in one pass: the modules in the order that recursion visits them (pre-order),
    each mapping the names of its own ``state_dict`` (names relative to it), and the first module
    to map a GGUF name keeps it, as the recursion's merge does.  ``n_blocks`` is the block count
    :mod:`.gguf_hparams` checked against the blocks the tensors hold, so the map is bounded by
    the tensor count."""
    import gguf

    kind = next((k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch), None)
    if kind is None:
        raise error("CONVERT_UNSUPPORTED", f"gguf-py has no tensor names for GGUF architecture {arch!r}", field="general.architecture")
    name_map = gguf.get_tensor_name_map(kind, n_blocks)
    out: dict[str, str] = {}
    for qual, module in model.named_modules(remove_duplicate=False):
        prefix = qual + "." if qual else ""
        local: dict[str, str] = {}
        for hf_name in module.state_dict():
            hf_name = processor.preprocess_name(hf_name)
            base, suffix = hf_name, ""
            if hf_name.endswith((".weight", ".bias")):
                base, suffix = hf_name.rsplit(".", 1)
                suffix = "." + suffix
            gname = name_map.get_name(base)
            if gname is None:
                processor.perform_fallback_tensor_mapping(local, suffix, prefix, hf_name)
                continue
            local[gname + suffix] = prefix + hf_name
        for k, v in local.items():
            out.setdefault(k, v)
    return out


def _config_json(config: Any, described: Any) -> bytes:
    """config.json: ``config`` as transformers writes it, with qformat's ``quantization_config``."""
    from qformat.model import required_version

    cfg = config.to_dict()
    cfg.pop("_name_or_path", None)  # where the GGUF was read from: not a property of the model
    # The GGUF values decode to float32 (what gguf-py and transformers' GGUF loader give); left
    # unset, from_pretrained's dtype "auto" would take the dtype of the file's first float tensor,
    # a float16 block scale.
    cfg["dtype"] = "float32"
    cfg["quantization_config"] = {"quant_method": "qformat", "spec_version": required_version(described.descriptors)}
    return (json.dumps(cfg, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


def _tokenizer_files(folder: str, name: str, config_json: bytes, described: Any, into: str) -> list[str]:
    """Save into the empty folder ``into`` the tokenizer transformers builds from the GGUF
    ``name`` in ``folder`` (``AutoTokenizer.from_pretrained(folder, gguf_file=name)``), beside
    ``config_json``, and prove that it loads back from there encoding as it does
    (:func:`_same_tokenizer`).  Returns the names of the files written, config.json left out."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except Exception as e:  # transformers raises ValueError/KeyError/NotImplementedError for what it cannot build
        kv = _kv(described)
        model = _kv_value(kv, "tokenizer.ggml.model")
        what = "no tokenizer.ggml.model" if model is None else f"tokenizer.ggml.model {model!r}"
        raise error("CONVERT_UNSUPPORTED", f"transformers cannot build a tokenizer from this GGUF ({what}): {type(e).__name__}: {e}",
                    field="tokenizer.ggml.model") from None
    with open(os.path.join(into, "config.json"), "wb") as f:
        f.write(config_json)
    tok.save_pretrained(into)
    _keep_added_tokens(tok, into)
    # what the tokenizer built from the GGUF encodes, then the tokenizer itself let go: the
    # one loaded back from the folder is not built beside it
    text = _probe_text(tok)
    want = _encode(tok, text)
    del tok
    _same_tokenizer(text, want, into)
    return sorted(n for n in _relative_files(into) if n != "config.json")


def _keep_added_tokens(tok: Any, folder: str) -> None:
    """Write the tokenizer's added tokens into the tokenizer_config.json it saved in ``folder``
    (``added_tokens_decoder``, as transformers computes it there: id -> the token's fields),
    where transformers 5 leaves them out for a ``tokenizers``-backed class.  Without them every
    ``AutoTokenizer.from_pretrained(folder)`` parses the whole tokenizer.json once more only to
    read its ``added_tokens`` (transformers' legacy path: 1 s of Gemma 3's 3.2 s load, its
    vocabulary a 33 MB tokenizer.json); with them it takes the same tokens from here, and builds
    the same tokenizer (its backend serializes alike, and it saves back the same files).  The
    other keys are written back as transformers wrote them (its JSON form: sorted, indent 2)."""
    path = os.path.join(folder, "tokenizer_config.json")
    if not os.path.isfile(path):
        return
    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)
    if not isinstance(cfg, dict) or "added_tokens_decoder" in cfg:
        return
    cfg["added_tokens_decoder"] = {str(i): t.__getstate__() for i, t in tok.added_tokens_decoder.items()}
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(cfg, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def _relative_files(folder: str) -> list[str]:
    return [os.path.relpath(os.path.join(root, n), folder) for root, _, names in os.walk(folder) for n in names]


def _read(folder: str, names: list[str]) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for n in names:
        with open(os.path.join(folder, n), "rb") as f:
            out[n] = f.read()
    return out


def _generation_config_json(config: Any) -> bytes:
    from transformers import GenerationConfig

    with tempfile.TemporaryDirectory(prefix="qformat-hf-") as tmp:
        with _building("the generation config", field="general.architecture"):
            GenerationConfig.from_model_config(config).save_pretrained(tmp)
        with open(os.path.join(tmp, "generation_config.json"), "rb") as f:
            return f.read()


def _model_files(folder: str, name: str, config: Any, described: Any) -> dict[str, bytes]:
    """config.json, generation_config.json and the tokenizer files, by name, made here, one after
    the other (:class:`_TokenizerJob` makes the tokenizer files beside the weights' write)."""
    files: dict[str, bytes] = {"config.json": _config_json(config, described)}
    files.update(_tokenizer_bytes(folder, name, files["config.json"], described))
    files.setdefault("generation_config.json", _generation_config_json(config))
    return files


def _tokenizer_bytes(folder: str, name: str, config_json: bytes, described: Any) -> dict[str, bytes]:
    """:func:`_tokenizer_files` made in a temporary folder, read back by name."""
    with tempfile.TemporaryDirectory(prefix="qformat-hf-") as tmp:
        return _read(tmp, _tokenizer_files(folder, name, config_json, described, tmp))


def _can_fork() -> bool:
    """Whether the tokenizer files are made in a forked child (:class:`_TokenizerJob`): on Linux
    (fork is the platform's own way to start a process there; macOS's system libraries are not
    safe to use in a forked child of a process that loaded them, and Windows has no fork), from
    a process running no other thread it knows of (:func:`_single_threaded`), unless
    ``QFORMAT_GGUF_TOKENIZER_INLINE`` is set to a non-empty value other than 0."""
    return (sys.platform.startswith("linux") and hasattr(os, "fork") and _single_threaded()
            and os.environ.get("QFORMAT_GGUF_TOKENIZER_INLINE", "") in ("", "0"))


def _single_threaded() -> bool:
    """No other Python thread (one could hold a lock the child would inherit held: a caller
    converting from several threads converts inline), and JAX not loaded (its runtime runs
    threads of its own and warns that a fork beside them may deadlock)."""
    import threading

    return threading.active_count() == 1 and "jax" not in sys.modules


class _TokenizerJob:
    """:func:`_tokenizer_files` in a forked child, while this process plans and writes the weights.

    The tokenizer is most of a folder conversion's work besides the weights (Gemma 3's 262k-token
    vocabulary: transformers builds it from the GGUF, saves it, and the proof loads it back, each
    a few seconds of Python) and needs nothing the weights' write makes, nor the reverse: the child
    runs it on the second core, on the key/values and the config this process parsed (inherited
    by the fork, :func:`.gguf_parse.parsed_once`'s answers included), and its memory (the
    vocabulary's Python objects, twice) is its own, given back when it ends.  It reports through a
    pipe, in JSON: the files it wrote into a folder made here, or a qformat error (code, message,
    tensor, field), raised here as it would have been raised in this process.  Anything else (an
    exception of another kind, the child killed) makes :meth:`files` return None: the caller then
    makes the files in this process, which raises that exception itself."""

    def __init__(self, folder: str, name: str, config_json: bytes, described: Any):
        self.config_json = config_json
        self.dir = tempfile.mkdtemp(prefix="qformat-hf-tokenizer-")
        self.pid: int | None = None
        self.fd: int | None = None
        read_end, write_end = os.pipe()
        for stream in (sys.stdout, sys.stderr):  # nothing buffered here is written twice
            with contextlib.suppress(Exception):
                stream.flush()
        try:
            pid = os.fork()
        except BaseException:
            os.close(read_end)
            os.close(write_end)
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        if pid == 0:  # the child: never returns (os._exit), runs no cleanup of the parent's
            try:
                os.close(read_end)
                try:
                    report: dict[str, Any] = {"files": _tokenizer_files(folder, name, config_json, described, self.dir)}
                except QFormatError as e:
                    report = {"error": {"code": e.code, "message": e.message, "tensor": e.tensor, "field": e.field}}
                except BaseException as e:  # noqa: BLE001 - made again in the parent, which raises it
                    report = {"failed": type(e).__name__}
                data = json.dumps(report).encode("utf-8")
                while data:
                    data = data[os.write(write_end, data):]
            finally:
                os._exit(0)
        os.close(write_end)
        self.pid, self.fd = pid, read_end

    def files(self) -> dict[str, bytes] | None:
        """The tokenizer files by name (read once the child ends), or None when the child failed
        other than with a qformat error; a qformat error is raised."""
        try:
            chunks = []
            while chunk := os.read(self.fd, 1 << 16):
                chunks.append(chunk)
            self._reap()
            try:
                report = json.loads(b"".join(chunks).decode("utf-8"))
            except ValueError:  # the child died before it reported
                return None
            if "error" in report:
                raise error(**report["error"])
            if "files" not in report:
                return None
            return _read(self.dir, report["files"])
        finally:
            self.cancel()

    def _reap(self) -> None:
        if self.pid is not None:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            self.pid = None

    def cancel(self) -> None:
        """Stop the child (when it still runs) and remove its folder."""
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            self._reap()
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None
        shutil.rmtree(self.dir, ignore_errors=True)


class _ModelFiles(Mapping):
    """config.json, generation_config.json and the tokenizer files, by name, for
    :func:`qformat.convert.writer.write`, which reads them once the weights are written: the
    tokenizer files are then taken from :class:`_TokenizerJob` (or made here where it failed
    other than with a qformat error, by ``inline()``)."""

    def __init__(self, known: dict[str, bytes], job: _TokenizerJob, inline: Any):
        self._known, self._job, self._inline = known, job, inline
        self._files: dict[str, bytes] | None = None

    def _all(self) -> dict[str, bytes]:
        if self._files is None:
            made = self._job.files()
            if made is None:
                made = self._inline()
            files = dict(self._known)
            for n, data in made.items():
                files.setdefault(n, data)
            self._files = files
        return self._files

    def cancel(self) -> None:
        self._job.cancel()

    def __getitem__(self, key: str) -> bytes:
        return self._all()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


#: Text both tokenizers must encode alike: spaces, digit runs, punctuation, contractions, accents,
#: CJK, an emoji (what tells pre-tokenizers apart).
TOKENIZER_PROBE = ("Hello world!  Two  spaces, tabs\tand\nnew lines; 0123456789 3 33 333 3333 3.14159 1,000,000. "
                   "I've 'RE you sure? Caf\u00e9 na\u00efve \u6f22\u5b57\u5de5\u4f5c \U0001f999\U0001f999 ------======= end.")
def _encode(tok: Any, text: str) -> list[int]:
    return list(tok(text).input_ids)


def _probe_text(tok: Any) -> str:
    """:data:`TOKENIZER_PROBE` and the tokenizer's BOS and EOS tokens."""
    return TOKENIZER_PROBE + "".join(t for t in (tok.bos_token, tok.eos_token) if isinstance(t, str))


def _same_tokenizer(text: str, want: list[int], saved: str) -> None:
    """The tokenizer written to the folder ``saved`` (with its config.json) must encode ``text``
    (:func:`_probe_text`) as ``want``, what the one transformers builds from the GGUF gives.  It
    can differ: transformers 5 picks the tokenizer class from config.json's model_type, and a
    model's class rebuilds the pre-tokenizer its models use (Qwen2's digit split), where the GGUF
    may ask for another (``tokenizer.ggml.pre``).  Such a tokenizer, or one that does not load
    back, is refused rather than written."""
    from transformers import AutoTokenizer

    try:
        got = _encode(AutoTokenizer.from_pretrained(saved), text)
    except Exception as e:
        raise error("CONVERT_UNSUPPORTED", f"the tokenizer transformers builds from this GGUF cannot be loaded back once saved "
                    f"({type(e).__name__}: {e})", field="tokenizer.ggml.model") from None
    if got != want:
        raise error("CONVERT_UNSUPPORTED", f"the tokenizer transformers builds from this GGUF encodes differently once saved "
                    f"with this model's config ({len(want)} tokens before, {len(got)} after, on a probe text; the GGUF's "
                    "tokenizer.ggml.pre is probably not the one transformers' tokenizer class for this model uses)",
                    field="tokenizer.ggml.pre")


def _processor_move(processor: Any, gname: str, shape: tuple[int, ...], quantized: bool) -> tuple[np.ndarray | None, bool]:
    """(row order or None, whether the processor changes values) for one GGUF tensor."""
    probe = (np.arange(shape[0], dtype=np.float64) + _PROBE).reshape((shape[0],) + (1,) * (len(shape) - 1)) if shape else None
    try:
        res = processor.process(weights=probe, name=gname)
        out = np.asarray(res.weights)
        renamed = res.name != gname
    except Exception:  # a processor that needs the real data (its shapes): try it on the full shape
        rows = _processor_rows_2d(processor, gname, shape)
        return (rows, False) if rows is not None else (None, True)
    if renamed:
        raise error("CONVERT_UNSUPPORTED", f"transformers' GGUF loader renames this tensor to {res.name!r} while it loads it", tensor=gname)
    if out is probe or (out.shape == probe.shape and np.array_equal(out, probe)):
        return None, False
    flat = out.reshape(-1)
    if out.shape == probe.shape and np.array_equal(np.sort(flat), probe.reshape(-1)):
        return (flat - _PROBE).astype(np.int64), False
    return None, True


def _processor_rows_2d(processor: Any, gname: str, shape: tuple[int, ...]) -> np.ndarray | None:
    """The row order of a processor that reshapes a 2-D tensor by its real width (Bloom's fused
    q/k/v, regrouped per head), found by running it on every element's own number: None unless
    every output row is a whole input row."""
    if len(shape) != 2 or not shape[0] or not shape[1]:
        return None
    probe = np.arange(shape[0] * shape[1], dtype=np.float64).reshape(shape) + _PROBE
    try:
        res = processor.process(weights=probe, name=gname)
    except Exception:  # noqa: BLE001 - not a move of rows
        return None
    out = np.asarray(res.weights)
    if res.name != gname or out.shape != probe.shape:
        return None
    rows = ((out[:, 0] - _PROBE) // shape[1]).astype(np.int64)
    if np.array_equal(np.sort(rows), np.arange(shape[0])) and np.array_equal(out, probe[rows]):
        return rows
    return None


def _processor_transposes(processor: Any, gname: str, shape: tuple[int, ...]) -> bool:
    """Whether the processor's change to this 2-D tensor is exactly a transpose (GPT-2's
    ``Conv1D`` weights): run on every element's own number, it gives their transpose."""
    if len(shape) != 2:
        return False
    probe = np.arange(shape[0] * shape[1], dtype=np.float64).reshape(shape) + _PROBE
    try:
        res = processor.process(weights=probe, name=gname)
    except Exception:  # noqa: BLE001 - a processor that needs the real data: not a transpose
        return False
    out = np.asarray(res.weights)
    return res.name == gname and out.shape == probe.shape[::-1] and np.array_equal(out, probe.T)


@dataclass(frozen=True)
class TransposedMove(Move):
    """A move whose tensor transformers takes as the transpose of the GGUF's (GPT-2's ``Conv1D``
    weights, ``[in, out]``, where llama.cpp stores ``[out, in]``): a plain tensor is transposed
    by its value function (its dtype kept); a quantized one keeps its packed components and
    gets the descriptor of the transpose (:func:`_transpose_packed`)."""


def _transposed_move(described: Any, gname: str, hf: str, shape: tuple[int, ...], quantized: bool) -> TransposedMove:
    if quantized:
        return TransposedMove(hf)
    dtype = described.plain.info(gname).dtype  # kept: a transpose changes no value
    return TransposedMove(hf, None, lambda a: np.ascontiguousarray(np.asarray(a).T), (dtype, (shape[1], shape[0])))


def _transpose_packed(out: Any, moves: dict[str, Move]) -> None:
    """Give each quantized tensor of a :class:`TransposedMove` in ``out`` (what :func:`relayout`
    made) the descriptor of its transpose over the same components
    (:func:`qformat.architectures.base.transposed_descriptor`: nothing re-encoded); one that
    has no such description is refused by name."""
    from qformat.architectures.base import transposed_descriptor

    for gname, mv in moves.items():
        if isinstance(mv, TransposedMove) and mv.name in out.descriptors:
            try:
                out.descriptors[mv.name] = transposed_descriptor(out.descriptors[mv.name])
            except ValueError as e:
                raise error("CONVERT_UNSUPPORTED", f"transformers takes this tensor transposed, and its packed form cannot be "
                            f"described transposed ({e})", tensor=gname) from None


def _values_fn(processor: Any, gname: str) -> Any:
    """transformers' processing of a plain tensor's values: binary32 in, as its loader feeds it."""
    def apply(a: np.ndarray) -> np.ndarray:
        out = np.asarray(processor.process(weights=np.asarray(a, dtype=np.float32), name=gname).weights)
        return np.ascontiguousarray(out, dtype=np.float32)

    return apply


def plan_moves(described: Any, config: Any, parsed_config: dict[str, Any], arch: str,
               shapes: dict[str, tuple[int, ...]] | None = None) -> tuple[dict[str, Move], list[str], list[str], Any]:
    """The moves that take a GGUF :class:`~qformat.convert.base.Described` to transformers'
    names: (moves, permuted HF names, left-out GGUF names, the model class)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    from qformat.convert.relayout import storage_of

    with _building(f"the {config.model_type} model on the meta device from this GGUF's hyperparameters", field="general.architecture"):
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=parsed_config)
    # the GGUF's own architecture names its tensors (transformers derives it from model_type,
    # which fails for a file whose general.name is "mistral": model_type mistral, no such GGUF arch)
    with _building("the GGUF tensor name map", field="general.architecture"):
        names = gguf_names(model, processor, arch, config.num_hidden_layers)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    moves: dict[str, Move] = {}
    permuted: list[str] = []
    left_out: list[str] = []
    for gname, shape in (shapes if shapes is not None else _shapes(described)).items():
        hf = names.get(gname)
        if hf is None:
            left_out.append(gname)
            continue
        # the shape first: a processor run on rows the hyperparameters do not describe (llama's
        # q/k permutation by head count) fails, which would read as "changes the values"
        if hf not in expected:
            raise error("CONVERT_SOURCE_INVALID", f"the model built from the GGUF hyperparameters has no parameter {hf!r}", tensor=gname)
        quantized = gname in described.descriptors
        # a transpose (GPT-2's Conv1D weights) swaps the shape (or keeps a square one, found below
        # once the row probe sees a change): a move of its own, exact for plain and packed tensors
        if expected[hf] != shape and len(shape) == 2 and expected[hf] == shape[::-1] and _processor_transposes(processor, gname, shape):
            moves[gname] = _transposed_move(described, gname, hf, shape, quantized)
            continue
        if expected[hf] != shape:
            raise error("CONVERT_SOURCE_INVALID", f"the tensor has shape {list(shape)}; the model built from the GGUF hyperparameters "
                        f"({type(model).__name__}) expects {list(expected[hf])} for {hf!r}", tensor=gname)
        rows, changes = _processor_move(processor, gname, shape, quantized)
        if changes and len(shape) == 2 and shape[0] == shape[1] and _processor_transposes(processor, gname, shape):
            moves[gname] = _transposed_move(described, gname, hf, shape, quantized)
            continue
        if changes and quantized:
            raise error("CONVERT_UNSUPPORTED", f"transformers changes this tensor's values when it loads it ({type(processor).__name__}), "
                        "which a packed tensor cannot follow exactly", tensor=gname)
        if rows is not None:
            permuted.append(hf)
        values = _values_fn(processor, gname) if changes else None
        info = (storage_of(np.dtype(np.float32)), shape) if changes else None
        moves[gname] = Move(hf, rows, values, info)
    provided = {m.name for m in moves.values()}
    tied = set(getattr(model, "all_tied_weights_keys", None) or {})  # targets transformers fills from their source
    missing = sorted(k for k in expected if k not in provided and k not in tied)
    if missing:
        raise error("CONVERT_SOURCE_INVALID", f"the GGUF has no tensor for {len(missing)} parameter(s) of {type(model).__name__}: "
                    f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}", tensor=missing[0])
    return moves, permuted, left_out, type(model)


def check_table(arch: str, moves: dict[str, Move], config: dict[str, Any], described: Any) -> None:
    """transformers' GGUF loader and qformat's architecture table (:mod:`qformat.architectures`,
    which ``qformat export --to gguf`` applies the other way) must agree on every tensor: its
    name, its row order (llama's rotary permutation) and whether its values change (Gemma's
    ``norm - 1``).  A disagreement is refused (``CONVERT_UNSUPPORTED``): a folder whose export
    would not give back the GGUF.  An architecture the table does not have converts as
    transformers loads it; its export is refused by name."""
    from qformat.architectures import by_gguf

    table = by_gguf(arch)
    if table is None:
        return
    for gname, mv in moves.items():
        try:
            back = table.gguf_name(mv.name)
        except KeyError:
            back = None
        if back != gname:
            raise error("CONVERT_UNSUPPORTED", f"transformers loads this tensor as {mv.name!r}, which qformat's {arch} table maps to "
                        f"{back!r}: the folder's export would not give back the GGUF", tensor=gname)
        shape = tuple(described.descriptors[gname]["shape"]) if gname in described.descriptors else tuple(described.plain.info(gname).shape)
        perm = table.permutation(mv.name, shape[0], config) if shape else None
        want_rows = None if perm is None else np.argsort(perm)
        rows_ok = (mv.rows is None and want_rows is None) or (mv.rows is not None and want_rows is not None
                                                                and np.array_equal(np.asarray(mv.rows), want_rows))
        shifted = table.shift(mv.name) != 0.0
        flipped = isinstance(mv, TransposedMove)
        if flipped != table.transposes(mv.name):
            raise error("CONVERT_UNSUPPORTED", f"transformers' GGUF loader {'transposes' if flipped else 'keeps'} {mv.name!r}, which "
                        f"qformat's {arch} table {'keeps' if flipped else 'transposes'}: the folder's export would not give back the GGUF",
                        tensor=gname)
        if not rows_ok or shifted != (mv.values is not None and not flipped):
            raise error("CONVERT_UNSUPPORTED", f"transformers' GGUF loader {'reorders' if not rows_ok else 'changes'} {mv.name!r} "
                        f"differently from qformat's {arch} table (rows {'moved' if mv.rows is not None else 'kept'}, values "
                        f"{'changed' if mv.values is not None else 'kept'}): the folder's export would not give back the GGUF", tensor=gname)


def convert_gguf(src: str | os.PathLike[str], dst: str | os.PathLike[str], overwrite: bool = False,
                 progress: TextIO | None = None) -> Summary:
    """Convert the GGUF model file ``src`` into the Hugging Face model folder ``dst`` (see the
    module docstring).  The folder is built beside ``dst`` and moved into place at the end, once
    everything is checked: the tokenizer's proof (:func:`_same_tokenizer`) runs while the weights
    are written beside ``dst`` (:class:`_TokenizerJob`), and a refusal removes them."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from .gguf_parse import parsed_once

    from qformat import convert as cv
    from qformat.checkpoint.source import Checkpoint
    from qformat.convert.gguf import METADATA_KEY
    from qformat.convert.writer import write

    ck = Checkpoint(src)
    if ck.kind != "gguf":
        raise error("CONVERT_UNSUPPORTED", f"the hf layout is for GGUF model files; {os.fspath(src)} is not one (its tensors keep their names)")
    described = cv.get("gguf").describe(ck)
    path = os.path.join(ck.folder, ck.files[0])
    kv = _kv(described)
    arch = _kv_value(kv, "general.architecture")
    if not isinstance(arch, str):
        raise error("CONVERT_SOURCE_INVALID", "the GGUF has no general.architecture", field="general.architecture")
    _check_architecture(arch)
    shapes = _shapes(described)
    all_kv = gguf_hparams.read_kv(described)
    gguf_hparams.check(arch, all_kv, shapes)
    folder, name = os.path.dirname(path), os.path.basename(path)
    record = json.loads(described.metadata[METADATA_KEY])
    # One parse of the GGUF (the core's, above): transformers' load_gguf_checkpoint and
    # read_gguf_metadata, here and inside AutoTokenizer.from_pretrained(gguf_file=), read the
    # key/values already parsed instead of parsing the file again (gguf-py's reader, then its own
    # twice: seconds per 100k-token vocabulary), and the config is parsed without the vocabulary
    tensor_names, version = [t[0] for t in record["tensors"]], record["version"]
    files: Mapping[str, bytes]
    with parsed_once(path, all_kv, tensor_names, version) as load_gguf_checkpoint:
        with _building("the model config from this GGUF's metadata", field="general.architecture"):
            parsed = load_gguf_checkpoint(path, return_tensors=False)
            # what AutoConfig.from_pretrained(folder, gguf_file=name) builds
            config = CONFIG_MAPPING[parsed["config"]["model_type"]].from_dict(dict(parsed["config"]))
        # The tokenizer files are made by a forked child while the weights are planned and
        # written here (:class:`_TokenizerJob`), its proof beside config.json as it will be: the
        # model class is the one AutoModelForCausalLM maps the model type to, checked below
        job = None
        predicted = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type)
        if isinstance(predicted, str) and _can_fork():
            config.architectures = [predicted]
            try:
                job = _TokenizerJob(folder, name, _config_json(config, described), described)
            except OSError:  # no process to be had (memory, a process limit): made here instead
                job = None
        try:
            moves, permuted, left_out, model_cls = plan_moves(described, config, parsed["config"], arch, shapes)
            check_table(arch, moves, config.to_dict(), described)
            config.architectures = [model_cls.__name__]
            if job is not None and job.config_json != _config_json(config, described):
                job.cancel()  # another class, or a config the model changed: made here instead
                job = None
            if job is None:
                files = _model_files(folder, name, config, described)
            else:
                def inline() -> dict[str, bytes]:
                    with parsed_once(path, gguf_hparams.read_kv(described), tensor_names, version):
                        return _tokenizer_bytes(folder, name, job.config_json, described)

                files = _ModelFiles({"config.json": job.config_json, "generation_config.json": _generation_config_json(config)},
                                    job, inline)
        except BaseException:
            if job is not None:
                job.cancel()
            raise
    # the key/values' Python objects (the vocabulary's, a few hundred thousand of each, 50 MB
    # for Gemma 3's) are not kept through the write: the fallback of _ModelFiles reads them again
    del all_kv, parsed, load_gguf_checkpoint
    try:
        # the meta model is gone (and the tokenizers, where made here): give their heap back
        # before the weights are written, so the write's working set is not added on top of
        # theirs.  Freed by their reference counts: a full gc.collect() here walked every object
        # of torch and transformers (0.2-0.7 s) and lowered neither model's peak (measured on
        # SmolLM2-135M and Gemma 3 270M)
        from qformat_torch.kernels import trim_heap

        trim_heap()
        out = relayout(described, moves)
        _transpose_packed(out, moves)
        # The GGUF key/values and tensor list stay in __metadata__ (``gguf`` and its ``gguf.kv.*``
        # members, as the single-file conversion records them): config.json and the tokenizer files
        # are transformers' reading of them, and `qformat export --to gguf` writes the original keys
        # (general.*, tokenizer flags, chat template, special ids, vocabulary) and tensor order back
        # from them, naming the tensors by the architecture table.  The tokenizer files are read
        # (the child waited for) once the weights are written, before the folder is moved into place.
        s = write(ck, out, os.fspath(dst), overwrite=overwrite, progress=progress, model_folder=files)
    finally:
        if isinstance(files, _ModelFiles):
            files.cancel()
    return Summary(os.fspath(dst), arch, str(config.model_type), model_cls.__name__, s.files, len(out.descriptors), len(out.plain),
                   s.bytes, sorted(permuted), sorted(left_out), sorted(files))


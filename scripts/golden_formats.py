#!/usr/bin/env python3
"""Writes the golden files of pagoda-kernels' weight-format round-trip test.

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install numpy gguf
    /tmp/venv/bin/python scripts/golden_formats.py

A NumPy implementation, written from each format's definition and independent of the Rust
code, quantizes and dequantizes a few seeded random matrices (4 x 256: Gaussian with a few
outliers, and rows whose scales differ by 100x) for

- the GGUF types Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 with gguf-py's `gguf.quants` (ggml's reference
  quantizers, in NumPy);
- the Pagoda-internal types INT8 (per channel), INT4 with groups of 32/64/128 (asymmetric
  and symmetric), NF4 and NF4_DQ, implemented below as crates/pagoda-kernels/src/quant/
  {int8,int4,nf4}.rs document them (f32 arithmetic, f16-stored scales, the NF4 table of
  bitsandbytes' csrc/kernels.cu).

Output, in crates/pagoda-kernels/tests/golden/formats/:

    input_<m>.f32           the matrix (f32 LE, row-major)
    <TYPE>_<m>.f32          its dequantized round trip
    summary.json            per type and matrix: RMSE and max |error| of the round trip

The Rust test (tests/kernels.rs, `formats_round_trip_matches_the_numpy_goldens`) needs no
Python. Seeds are fixed: rerunning reproduces the committed files.
"""

from __future__ import annotations

import json
import os

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

OUT = os.path.join(
    os.path.dirname(os.path.abspath(__file__)),
    "..", "crates", "pagoda-kernels", "tests", "golden", "formats",
)
F = np.float32

NF4 = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236572, 1.0,
], dtype=F)


def f16(x):
    """Round to f16 (nearest even) and back to f32, as a stored f16 scale."""
    return np.asarray(x, dtype=F).astype(np.float16).astype(F)


def round_away(v):
    """Round half away from zero (Rust's f32::round), exactly (in f64)."""
    v = np.asarray(v, dtype=np.float64)
    return (np.sign(v) * np.floor(np.abs(v) + 0.5)).astype(F)


def recip(d):
    return np.where(d != 0, F(1.0) / np.where(d != 0, d, F(1.0)), F(0.0)).astype(F)


def int8_rt(x):
    s = (np.max(np.abs(x), axis=1, keepdims=True) / F(127.0)).astype(F)
    q = np.clip(round_away(x * recip(s)), -127, 127)
    return (q * s).astype(F)


def int4_rt(x, g, sym):
    rows, cols = x.shape
    b = x.reshape(rows, cols // g, g)
    if sym:
        idx = np.argmax(np.abs(b), axis=2)[..., None]
        v = np.take_along_axis(b, idx, axis=2)
        d = f16(v / F(-8.0))
        q = np.clip(np.floor(b * recip(d) + F(8.5)), 0, 15)
        y = d * (q - F(8.0))
    else:
        mn = b.min(axis=2, keepdims=True)
        mx = b.max(axis=2, keepdims=True)
        m = f16(mn)
        d = f16((mx - m) / F(15.0))
        q = np.clip(np.floor((b - m) * recip(d) + F(0.5)), 0, 15)
        y = d * q + m
    return y.astype(F).reshape(rows, cols)


def nf4_codes(b, amax):
    v = np.clip(b * recip(amax), F(-1.0), F(1.0))
    mids = ((NF4[:-1] + NF4[1:]) * F(0.5)).astype(F)
    return np.searchsorted(mids, v, side="left")


def nf4_rt(x):
    rows, cols = x.shape
    b = x.reshape(rows, cols // 64, 64)
    amax = np.max(np.abs(b), axis=2, keepdims=True)
    return (NF4[nf4_codes(b, amax)] * amax).astype(F).reshape(rows, cols)


def nf4_dq_rt(x):
    """Per row: absmaxes minus their mean, int8 with one f32 scale per 256 blocks."""
    rows, cols = x.shape
    out = np.empty_like(x)
    for r in range(rows):
        b = x[r].reshape(cols // 64, 64)
        amax = np.max(np.abs(b), axis=1)
        total = F(0.0)
        for a in amax:  # sequential f32 sum, as the Rust quantizer adds
            total = F(total + a)
        mean = F(total / F(len(amax)))
        deq = np.empty_like(amax)
        for g0 in range(0, len(amax), 256):
            am = amax[g0:g0 + 256]
            c = F(np.max(np.abs(am - mean)) / F(127.0))
            k = np.clip(round_away((am - mean) * recip(c)), -127, 127)
            deq[g0:g0 + 256] = (k * c).astype(F) + mean
        deq = deq.astype(F)[:, None]
        out[r] = (NF4[nf4_codes(b, deq)] * deq).astype(F).reshape(cols)
    return out


def gguf_rt(ty):
    def rt(x):
        return quants.dequantize(quants.quantize(x, ty), ty).astype(F).reshape(x.shape)
    return rt


FORMATS = {
    "Q4_0": gguf_rt(T.Q4_0),
    "Q4_1": gguf_rt(T.Q4_1),
    "Q5_0": gguf_rt(T.Q5_0),
    "Q5_1": gguf_rt(T.Q5_1),
    "Q8_0": gguf_rt(T.Q8_0),
    "INT8": int8_rt,
    "INT4_G32": lambda x: int4_rt(x, 32, False),
    "INT4_G64": lambda x: int4_rt(x, 64, False),
    "INT4_G128": lambda x: int4_rt(x, 128, False),
    "INT4_G32_SYM": lambda x: int4_rt(x, 32, True),
    "INT4_G64_SYM": lambda x: int4_rt(x, 64, True),
    "INT4_G128_SYM": lambda x: int4_rt(x, 128, True),
    "NF4": nf4_rt,
    "NF4_DQ": nf4_dq_rt,
}


def matrices():
    rng = np.random.default_rng(20261203)
    a = rng.standard_normal((4, 256)).astype(F) * F(0.02)
    for r, c in [(0, 5), (1, 200), (2, 77), (3, 128)]:
        a[r, c] = F(0.5) * (1 if c % 2 else -1)  # outliers, 25x the spread
    b = rng.standard_normal((4, 256)).astype(F) * np.array(
        [[0.001], [0.01], [0.1], [1.0]], dtype=F)
    return {"gauss_outliers": a, "row_scales": b}


def main():
    os.makedirs(OUT, exist_ok=True)
    summary = {}
    for m, x in matrices().items():
        x = np.ascontiguousarray(x, dtype=F)
        x.astype("<f4").tofile(os.path.join(OUT, f"input_{m}.f32"))
        for name, rt in FORMATS.items():
            y = rt(x)
            assert y.shape == x.shape and y.dtype == F, name
            y.astype("<f4").tofile(os.path.join(OUT, f"{name}_{m}.f32"))
            e = (y.astype(np.float64) - x.astype(np.float64))
            summary.setdefault(name, {})[m] = {
                "rmse": float(np.sqrt(np.mean(e * e))),
                "max_abs": float(np.max(np.abs(e))),
            }
            print(f"{name:14} {m:15} rmse {summary[name][m]['rmse']:.3e} "
                  f"max {summary[name][m]['max_abs']:.3e}")
    with open(os.path.join(OUT, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""MXFP4 (OCP microscaling FP4: blocks of 32 E2M1 values sharing one E8M0 scale) in the two
layouts Pagoda reads, for the goldens.

Values: E2M1 codes 0..7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6 and codes 8..15 the same with the sign
bit (bit 3) set (code 8 is -0); a block's scale byte s is 2^(s - 127) (s = 255, NaN in the OCP
spec, is not used here). value = E2M1[code] * 2^(s - 127).

Layouts:
- Hugging Face (openai/gpt-oss-*): `*_blocks` uint8 [..., rows, K/32, 16] and `*_scales` uint8
  [..., rows, K/32], K the input (reduction) dimension; byte i of a block holds element 2i in
  its low nibble and element 2i + 1 in its high nibble. transformers'
  `convert_moe_packed_tensors` turns [E, rows, K/32, 16] into [E, K, rows] (x @ W).
- ggml / GGUF type 39 (MXFP4): 17 bytes per block, the scale byte first, then qs[16] with
  element j in the low nibble of qs[j] and element j + 16 in its high nibble. ggml computes
  kvalues (the E2M1 values doubled: 0, 1, 2, 3, 4, 6, 8, 12, ...) times 2^(s - 128)
  (`ggml_e8m0_to_fp32_half`; s = 0 and 1 as f32 subnormals): the same values, except that
  code 8 is +0.0 in ggml (integer kvalues) and -0.0 in transformers.
  llama.cpp's converter (`conversion/gpt_oss.py`, `repack_mxfp4`) moves HF blocks into this
  layout without dequantizing.

Quantization (`quantize`) follows gguf-py's `MXFP4.quantize_blocks` (and ggml's
`quantize_row_mxfp4_ref`, the same rule): s = floor(log2(amax)) - 2 + 127 (0 for an all-zero
block), so amax / 2^(s - 127) lies in [4, 8) (but where float32 log2 rounds up to an integer:
amax = 8 - 1 ulp gets s = 128) and values past 6 saturate to +-6; each value takes the code
whose value is nearest, a tie going to the earlier code in the order 0, 0.5, ..., 6, -0, -0.5,
..., -6 (numpy's argmin): so +-x halfway between two magnitudes goes to the smaller one, and
no value is ever coded -0 (code 8).

`blocks_golden` writes tests/golden/mxfp4_blocks.json: single blocks dequantized by gguf-py
(and by transformers from the HF layout) and f32 vectors quantized by gguf-py, for unit tests
of a decoder and an encoder.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
BLOCK = 32
SCALE_BIAS = 127

SDIST = Path(os.environ.get("PAGODA_LLAMA_SDIST",
                            "/work/cache/sdist/llama_cpp_python-0.3.36")) / "vendor" / "llama.cpp"


def gguf_module():
    """The vendored llama.cpp's gguf-py (the one its converter uses)."""
    sys.path.insert(0, str(SDIST / "gguf-py"))
    try:
        import gguf
    finally:
        sys.path.pop(0)
    assert "vendor/llama.cpp/gguf-py" in gguf.__file__, gguf.__file__
    return gguf


def gguf_quants():
    """gguf-py's `quants` module (vendored llama.cpp)."""
    return gguf_module().quants


def quantize(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """f32 `w` [..., K] (K a multiple of 32) quantized along its last axis into the Hugging
    Face layout: (blocks uint8 [..., K/32, 16], scales uint8 [..., K/32])."""
    w = np.asarray(w, dtype=np.float32)
    assert w.shape[-1] % BLOCK == 0, w.shape
    x = w.reshape(*w.shape[:-1], w.shape[-1] // BLOCK, BLOCK)
    amax = np.abs(x).max(axis=-1)
    with np.errstate(divide="ignore"):
        s = np.where(amax > 0, np.floor(np.log2(amax)) - 2 + SCALE_BIAS, 0)
    assert (s >= 0).all() and (s <= 254).all(), (s.min(), s.max())
    s = s.astype(np.uint8)
    unit = np.ldexp(np.float32(1.0), s.astype(np.int32) - SCALE_BIAS).astype(np.float32)
    values = np.array(E2M1, dtype=np.float32)
    with np.errstate(over="ignore"):  # blocks near f32's top: inf errors never win
        err = np.abs(unit[..., None, None] * values - x[..., None])
    codes = err.argmin(axis=-1).astype(np.uint8)  # first of equal errors: E2M1 order
    blocks = codes[..., 0::2] | (codes[..., 1::2] << np.uint8(4))
    return blocks, s


def codes_of(blocks: np.ndarray) -> np.ndarray:
    """HF-layout blocks [..., 16] -> codes [..., 32] in element order."""
    codes = np.empty((*blocks.shape[:-1], BLOCK), dtype=np.uint8)
    codes[..., 0::2] = blocks & 0x0F
    codes[..., 1::2] = blocks >> 4
    return codes


def hf_blocks_of(codes: np.ndarray) -> np.ndarray:
    """Codes [..., 32] in element order -> HF-layout blocks [..., 16]."""
    codes = np.asarray(codes, dtype=np.uint8)
    return codes[..., 0::2] | (codes[..., 1::2] << np.uint8(4))


def dequantize(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """HF-layout (blocks [..., G, 16], scales [..., G]) -> f32 [..., G * 32]."""
    vals = np.array(E2M1, dtype=np.float32)[codes_of(blocks)]
    out = np.ldexp(vals, scales.astype(np.int32)[..., None] - SCALE_BIAS).astype(np.float32)
    return out.reshape(*blocks.shape[:-2], blocks.shape[-2] * BLOCK)


def to_ggml(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """HF-layout (blocks [..., G, 16], scales [..., G]) -> ggml MXFP4 blocks [..., G, 17]."""
    codes = codes_of(blocks)
    qs = codes[..., :16] | (codes[..., 16:] << np.uint8(4))
    return np.concatenate([scales[..., None].astype(np.uint8), qs], axis=-1)


def from_ggml(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml MXFP4 blocks [..., 17] -> HF-layout (blocks [..., 16], scales [...])."""
    scales, qs = raw[..., 0], raw[..., 1:]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
    return hf_blocks_of(codes), scales


def same_values(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-identical f32 arrays, except that -0.0 and +0.0 count as equal (code 8, -0, is +0.0
    in ggml, whose kvalues are integers, and -0.0 in transformers' FP4_VALUES)."""
    a, b = np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32)
    nz = (a != 0) | (b != 0)
    return bool(np.array_equal(a, b) and np.array_equal(a[nz].view(np.uint32), b[nz].view(np.uint32)))


def check_against_references(w: np.ndarray, blocks: np.ndarray, scales: np.ndarray) -> None:
    """`quantize(w)` == gguf-py's MXFP4 quantization (through `to_ggml`), `dequantize` ==
    gguf-py's and transformers' dequantization (bit for bit, up to the sign of zero)."""
    import torch
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    q = gguf_quants()
    flat = np.asarray(w, dtype=np.float32).reshape(-1, BLOCK)
    ggml = q.quantize(flat.reshape(-1, w.shape[-1]), q.GGMLQuantizationType.MXFP4)
    ours = to_ggml(blocks, scales).reshape(ggml.shape)
    assert np.array_equal(ours, ggml), "MXFP4 quantization differs from gguf-py's"
    deq = dequantize(blocks, scales)
    ggml_deq = q.dequantize(ggml, q.GGMLQuantizationType.MXFP4).reshape(deq.shape)
    assert same_values(deq, ggml_deq), "gguf-py dequantizes otherwise"
    # transformers wants [E, rows, G, 16] and gives [E, G * 32, rows].
    b3 = torch.from_numpy(blocks.reshape(1, -1, *blocks.shape[-2:]).copy())
    s3 = torch.from_numpy(scales.reshape(1, -1, scales.shape[-1]).copy())
    hf = convert_moe_packed_tensors(b3, s3, dtype=torch.float32)[0].T.numpy().reshape(deq.shape)
    assert np.array_equal(deq.view(np.uint32), hf.view(np.uint32)), "transformers dequantizes otherwise"


# ------------------------------------------------------------------------------------------
# tests/golden/mxfp4_blocks.json


def _dequant_case(name: str, scale: int, codes: list[int]) -> dict:
    import torch
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    import make_goldens as mg

    q = gguf_quants()
    assert len(codes) == BLOCK
    hf_blocks = hf_blocks_of(np.array(codes))
    hf_scale = np.array([scale], dtype=np.uint8)
    ggml = to_ggml(hf_blocks[None], hf_scale)  # [1, 17]
    values = q.dequantize(ggml, q.GGMLQuantizationType.MXFP4).reshape(-1)
    assert np.isfinite(values).all(), name
    hf = convert_moe_packed_tensors(torch.from_numpy(hf_blocks.reshape(1, 1, 1, 16).copy()),
                                    torch.from_numpy(hf_scale.reshape(1, 1, 1).copy()),
                                    dtype=torch.float32).reshape(-1).numpy()
    assert same_values(values, hf), name
    assert np.array_equal(hf.view(np.uint32), dequantize(hf_blocks[None], hf_scale).view(np.uint32))
    return {"name": name, "scale": scale, "codes": codes, "block_hex": ggml.tobytes().hex(),
            "hf_blocks_hex": hf_blocks.tobytes().hex(), "values": mg.f32_list(values)}


def _quant_case(name: str, values: np.ndarray, note: str | None = None) -> dict:
    import make_goldens as mg

    q = gguf_quants()
    values = np.asarray(values, dtype=np.float32)
    assert values.shape == (BLOCK,)
    with np.errstate(over="ignore"):  # the block near f32's top: inf errors never win
        ggml = q.quantize(values.reshape(1, BLOCK), q.GGMLQuantizationType.MXFP4).reshape(17)
    blocks, scales = from_ggml(ggml)
    ours_b, ours_s = quantize(values)
    assert np.array_equal(ours_b.reshape(16), blocks) and int(ours_s[0]) == int(scales), name
    back = q.dequantize(ggml.reshape(1, 17), q.GGMLQuantizationType.MXFP4).reshape(-1)
    case = {"name": name, "values": mg.f32_list(values), "block_hex": ggml.tobytes().hex(),
            "scale": int(scales), "codes": [int(c) for c in codes_of(blocks)],
            "hf_blocks_hex": blocks.tobytes().hex(), "dequantized": mg.f32_list(back)}
    if note:
        case["note"] = note
    return case


def blocks_golden(out: Path) -> None:
    """Single MXFP4 blocks and their values (gguf-py's dequantization, which transformers'
    matches bit for bit from the HF layout), and f32 blocks gguf-py quantizes."""
    import make_goldens as mg

    rng = np.random.default_rng(39)
    every = list(range(16)) + list(range(15, -1, -1))
    dequant = [
        _dequant_case("every code, scale 1 (s = 127)", 127, every),
        _dequant_case("every code, s = 0 (2^-127: f32 subnormals below 2^-126)", 0, every),
        _dequant_case("every code, s = 1", 1, [int(c) for c in rng.permutation(every)]),
        _dequant_case("every code, s = 2", 2, [int(c) for c in rng.permutation(every)]),
        _dequant_case("s = 254 (2^127), codes up to +-1.5 (2 * 2^127 overflows f32)", 254,
                      [int(c) for c in rng.choice([0, 1, 2, 3, 8, 9, 10, 11], BLOCK)]),
        _dequant_case("zero block: codes 0 and 8 (-0.0)", 120, [0, 8] * 16),
        _dequant_case("s = 118 (2^-9), random codes", 118, [int(c) for c in rng.integers(0, 16, BLOCK)]),
        _dequant_case("s = 131 (16), random codes", 131, [int(c) for c in rng.integers(0, 16, BLOCK)]),
    ]
    halves = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    ties = np.array(halves + [-h for h in halves] + [0.0, 6.0, 7.0, 7.9, -7.9, -6.5, 0.5, -0.5, 1.0, -1.0,
                                                   3.0, -3.0, 4.0, -4.0, 6.0, -6.0, 2.0, 0.1],
                    dtype=np.float32)
    tiny = rng.standard_normal(BLOCK).astype(np.float32)
    tiny *= np.float32(1.3 * 2.0 ** -124) / np.abs(tiny).max()
    below8 = np.linspace(-3, 3, BLOCK).astype(np.float32)
    below8[5] = np.nextafter(np.float32(8), np.float32(0))
    quant = [
        _quant_case("gaussian", rng.standard_normal(BLOCK)),
        _quant_case("gaussian * 0.02", 0.02 * rng.standard_normal(BLOCK)),
        _quant_case("zero vector (s = 0, all codes 0)", np.zeros(BLOCK)),
        _quant_case("ties: amax 7.9 gives scale 1; x.25, x.75, 2.5, 3.5, 5 halfway between codes; "
                    "7, 7.9 saturate", ties,
                    "a tie takes the earlier code in E2M1 order: the smaller magnitude, +-0.25 -> +0"),
        _quant_case("amax exactly 4 (s = 127; code 6 = 4, no value reaches 6)",
                    np.concatenate([[4.0], np.linspace(-3.9, 3.9, BLOCK - 1)])),
        _quant_case("tiny: amax 1.3 * 2^-124 (s = 1)", tiny),
        _quant_case("huge: amax 3e38 (s = 252)", np.linspace(-3e38, 3e38, BLOCK)),
        _quant_case("amax = 8 - 1 ulp", below8,
                    "numpy's float32 log2(8 - ulp) rounds to 3.0, so gguf-py takes s = 128 (scale 2), "
                    "not floor(log2(amax)) - 2 + 127 = 127 from the exponent bits"),
    ]
    mg.write_json(out, {
        "source": "gguf-py of the vendored llama.cpp (llama-cpp-python 0.3.36 sdist): "
                  "quants.MXFP4.dequantize_blocks / quantize_blocks; dequant values also equal "
                  "transformers' convert_moe_packed_tensors on hf_blocks_hex with the same scale (bit "
                  "for bit, but code 8 (-0): +0.0 in ggml, whose kvalues are integers, -0.0 in "
                  "transformers)",
        "format": "block_hex: a ggml MXFP4 block (GGML type 39), 17 bytes: the E8M0 scale byte s, then "
                  "qs[16] with element j in the low nibble of qs[j] and element j + 16 in its high "
                  "nibble. hf_blocks_hex: the same 32 codes in the Hugging Face layout (gpt-oss "
                  "*_blocks), 16 bytes, element 2i in the low nibble of byte i and 2i + 1 in its high "
                  "nibble; its *_scales byte is `scale`. codes: the 32 E2M1 codes in element order. "
                  "value = E2M1[code] * 2^(s - 127), E2M1 = [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0, -0.5, -1, "
                  "-1.5, -2, -3, -4, -6]",
        "quant_rule": "s = floor(log2(amax)) - 2 + 127 (numpy float32 log2; s = 0 when amax = 0); each "
                      "value takes the code minimizing |E2M1[code] * 2^(s - 127) - x|, the first such "
                      "code in E2M1 order on a tie",
        "e2m1": list(E2M1),
        "dequant": dequant,
        "quant": quant,
    }, indent=1)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import make_goldens

    blocks_golden(make_goldens.GOLDEN / "mxfp4_blocks.json")

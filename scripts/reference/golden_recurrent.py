#!/usr/bin/env python3
"""Goldens for pagoda-kernels' recurrent kernels (crates/pagoda-kernels/src/recurrent/),
computed by transformers' own torch functions on small random f32 inputs.

    /root/.venvs/pagoda-ref/bin/python scripts/reference/golden_recurrent.py

References (imported, not rewritten):
- short convolution: `causal_conv1d_fn` (prefill from a zero state) and `causal_conv1d_update`
  (from a given state, over several tokens at once) of models/qwen3_5; LFM2's ShortConv calls
  the same functions (models/lfm2) without an activation and with an optional bias.
- gated DeltaNet: `torch_recurrent_gated_delta_rule` and `torch_chunk_gated_delta_rule`
  (chunk 64) of models/qwen3_5; the script checks that models/qwen3_next's copies give the same
  outputs. The gates `g = -exp(A_log) * softplus(a + dt_bias)` and `beta = sigmoid(b)` are the
  two lines of `Qwen3_5GatedDeltaNet.forward`, run here with the same torch calls.
- Mamba-2 SSD: `mamba2_selective_state_update` (token by token) and `mamba2_chunk_scan`
  (chunk 64) of models/mamba2; the script checks that models/nemotron_h's and
  models/granitemoehybrid's copies give the same outputs.

Every case runs T = 150 tokens (chunks of 64, 64 and 22) and starts from a non-zero state
unless its name says `zero`. Output, in crates/pagoda-kernels/tests/golden/recurrent/:

    recurrent.bin    every array, f32 little-endian, one after the other
    recurrent.json   per case: its dimensions and, per array, offset (in f32s) and shape

Array layouts are the Rust kernels' (token-major, state layouts as documented in
recurrent/mod.rs), transposed here from torch's. CI never runs this script: its outputs are
committed and the Rust test crates/pagoda-kernels/tests/recurrent.rs compares against them.
The seed is fixed.
"""

from __future__ import annotations

import json
import os

import torch
import torch.nn.functional as F
from transformers.models.granitemoehybrid import modeling_granitemoehybrid as granite
from transformers.models.mamba2 import modeling_mamba2 as mamba2
from transformers.models.nemotron_h import modeling_nemotron_h as nemotron_h
from transformers.models.qwen3_5 import modeling_qwen3_5 as qwen35
from transformers.models.qwen3_next import modeling_qwen3_next as qwen3_next

OUT = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "crates", "pagoda-kernels", "tests", "golden", "recurrent"
)
T = 150
CHUNK = 64


class Writer:
    def __init__(self) -> None:
        self.blob: list[torch.Tensor] = []
        self.offset = 0
        self.cases: dict[str, dict] = {}

    def case(self, name: str, dims: dict, arrays: dict[str, torch.Tensor]) -> None:
        entry = {"dims": dims, "arrays": {}}
        for key, value in arrays.items():
            flat = value.detach().to(torch.float32).contiguous().reshape(-1)
            entry["arrays"][key] = {"offset": self.offset, "shape": list(value.shape)}
            self.blob.append(flat)
            self.offset += flat.numel()
        self.cases[name] = entry

    def save(self) -> None:
        os.makedirs(OUT, exist_ok=True)
        torch.cat(self.blob).numpy().astype("<f4").tofile(os.path.join(OUT, "recurrent.bin"))
        with open(os.path.join(OUT, "recurrent.json"), "w") as f:
            json.dump({"t": T, "chunk": CHUNK, "cases": self.cases}, f, indent=1)
            f.write("\n")


def conv_cases(w: Writer, gen: torch.Generator) -> None:
    # (name, channels, width, bias, activation)
    for name, channels, width, bias, activation in [
        ("conv_qwen35", 12, 4, False, "silu"),
        ("conv_lfm2", 10, 3, True, None),
    ]:
        x = torch.randn(T, channels, generator=gen)
        weight = torch.randn(channels, width, generator=gen) * 0.5
        b = torch.randn(channels, generator=gen) if bias else None
        state0 = torch.randn(width - 1, channels, generator=gen)  # [K-1, C]
        # From a zero state: the prefill function of a fresh sequence.
        out_zero = qwen35.causal_conv1d_fn(x.T[None], weight, b, activation=activation)[0].T
        # From a given state: the update function takes the state as [C, K-1] and any length.
        conv_state = state0.T[None].clone()
        out_state = qwen35.causal_conv1d_update(x.T[None], conv_state, weight, b, activation=activation)[0].T
        final_state = conv_state[0].T  # [K-1, C]
        # LFM2's module is these functions without an activation.
        if name == "conv_lfm2":
            from transformers.models.lfm2 import modeling_lfm2 as lfm2

            again = lfm2.causal_conv1d_fn(x.T[None], weight, b, activation=None)[0].T
            assert torch.equal(again, out_zero)
        arrays = {"x": x, "weight": weight, "state0": state0}
        if b is not None:
            arrays["bias"] = b
        arrays.update(out_zero=out_zero, out_state=out_state, final_state=final_state)
        w.case(
            name,
            {"channels": channels, "width": width, "silu": activation == "silu", "bias": bias},
            arrays,
        )


def gates(a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor):
    """The two gate lines of Qwen3_5GatedDeltaNet.forward."""
    beta = b.sigmoid()
    g = -a_log.float().exp() * F.softplus(a.float() + dt_bias)
    return g, beta


def delta_cases(w: Writer, gen: torch.Generator) -> None:
    # (name, k heads, v heads, d_k, d_v, l2norm in kernel, zero initial state)
    for name, hk, hv, dk, dv, l2norm, zero in [
        ("delta_grouped_l2norm", 2, 4, 16, 12, True, False),
        ("delta_plain", 2, 2, 8, 8, False, False),
        ("delta_zero_state", 1, 2, 8, 4, True, True),
    ]:
        q = torch.randn(T, hk, dk, generator=gen)
        k = torch.randn(T, hk, dk, generator=gen)
        if not l2norm:
            # Without the kernel's normalization the caller hands in keys of norm ~1
            # (beta * |k|^2 > 2 would make the delta rule diverge).
            k = k / dk**0.5
        v = torch.randn(T, hv, dv, generator=gen)
        a = torch.randn(T, hv, generator=gen)
        b = torch.randn(T, hv, generator=gen)
        a_log = torch.log(torch.empty(hv).uniform_(0.5, 8.0, generator=gen))
        dt_bias = torch.randn(hv, generator=gen) * 0.5
        g, beta = gates(a, b, a_log, dt_bias)
        state0 = torch.zeros(hv, dk, dv) if zero else torch.randn(hv, dk, dv, generator=gen) * 0.5
        args = (q[None], k[None], v[None], g[None], beta[None])
        init = None if zero else state0[None].clone()
        out_rec, state_rec = qwen35.torch_recurrent_gated_delta_rule(
            *args, initial_state=init, output_final_state=True, use_qk_l2norm_in_kernel=l2norm
        )
        init = None if zero else state0[None].clone()
        out_chunk, state_chunk = qwen35.torch_chunk_gated_delta_rule(
            *args, chunk_size=CHUNK, initial_state=init, output_final_state=True, use_qk_l2norm_in_kernel=l2norm
        )
        # Qwen3-Next's copies are the same functions.
        init = None if zero else state0[None].clone()
        again, _ = qwen3_next.torch_chunk_gated_delta_rule(
            *args, chunk_size=CHUNK, initial_state=init, output_final_state=True, use_qk_l2norm_in_kernel=l2norm
        )
        assert torch.allclose(again, out_chunk, atol=1e-6), name
        print(
            f"{name}: torch chunk vs recurrent: out {float((out_chunk - out_rec).abs().max()):.2e}, "
            f"state {float((state_chunk - state_rec).abs().max()):.2e}"
        )
        w.case(
            name,
            {"n_k_heads": hk, "n_v_heads": hv, "d_k": dk, "d_v": dv, "qk_l2norm": l2norm},
            {
                "q": q,
                "k": k,
                "v": v,
                "a": a,
                "b": b,
                "a_log": a_log,
                "dt_bias": dt_bias,
                "g": g,
                "beta": beta,
                "state0": state0,
                "out_recurrent": out_rec[0],
                "state_recurrent": state_rec[0],
                "out_chunk": out_chunk[0],
                "state_chunk": state_chunk[0],
            },
        )


def ssd_cases(w: Writer, gen: torch.Generator) -> None:
    # (name, heads, head_dim, state, groups, D, zero initial state)
    for name, heads, head_dim, state, groups, with_d, zero in [
        ("ssd_grouped", 4, 8, 16, 2, True, False),
        ("ssd_one_group_no_d", 2, 4, 8, 1, False, False),
        ("ssd_zero_state", 2, 4, 8, 2, True, True),
    ]:
        x = torch.randn(T, heads, head_dim, generator=gen)
        dt_raw = torch.randn(T, heads, generator=gen)
        dt_bias = torch.randn(heads, generator=gen) * 0.5 - 1.0
        a_log = torch.log(torch.arange(1, heads + 1, dtype=torch.float32))
        a = -torch.exp(a_log)
        b = torch.randn(T, groups, state, generator=gen)
        c = torch.randn(T, groups, state, generator=gen)
        d = torch.randn(heads, generator=gen) if with_d else None
        state0 = torch.zeros(heads, head_dim, state) if zero else torch.randn(heads, head_dim, state, generator=gen)
        dt_limit = (0.0, float("inf"))
        # The processed time step, as both functions compute it (softplus(dt + dt_bias), clamped).
        dt = torch.clamp(F.softplus(dt_raw + dt_bias), dt_limit[0], dt_limit[1])
        # Token by token, as mamba2_scan_forward calls the step function.
        s = state0[None].clone()
        outs = []
        for t in range(T):
            o = mamba2.mamba2_selective_state_update(
                s,
                x[t][None],
                dt_raw[t][None, :, None].expand(-1, -1, head_dim),
                a[:, None, None].expand(-1, head_dim, state),
                b[t][None],
                c[t][None],
                d[:, None].expand(-1, head_dim) if d is not None else None,
                dt_bias=dt_bias[:, None].expand(-1, head_dim),
                dt_softplus=True,
            )
            outs.append(o[0])
        out_step = torch.stack(outs)
        state_step = s[0]

        def chunk_scan(module):
            return module.mamba2_chunk_scan(
                x[None],
                dt_raw[None],
                a,
                b[None],
                c[None],
                chunk_size=CHUNK,
                D=d,
                dt_bias=dt_bias,
                initial_states=None if zero else state0[None].clone(),
                dt_softplus=True,
                dt_limit=dt_limit,
                return_final_states=True,
            )

        out_chunk, state_chunk = chunk_scan(mamba2)
        for other in (nemotron_h, granite):
            o2, s2 = chunk_scan(other)
            assert torch.equal(o2, out_chunk) and torch.equal(s2, state_chunk), (name, other.__name__)
        print(
            f"{name}: torch chunk vs step: out {float((out_chunk[0] - out_step).abs().max()):.2e}, "
            f"state {float((state_chunk[0] - state_step).abs().max()):.2e}"
        )
        arrays = {
            "x": x,
            "dt_raw": dt_raw,
            "dt_bias": dt_bias,
            "dt": dt,
            "a": a,
            "b": b,
            "c": c,
        }
        if d is not None:
            arrays["d"] = d
        arrays.update(
            state0=state0,
            out_step=out_step,
            state_step=state_step,
            out_chunk=out_chunk[0],
            state_chunk=state_chunk[0],
        )
        w.case(
            name,
            {"n_heads": heads, "head_dim": head_dim, "state_dim": state, "n_groups": groups, "d": with_d},
            arrays,
        )


def main() -> None:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(20260501)
    w = Writer()
    with torch.no_grad():
        conv_cases(w, gen)
        delta_cases(w, gen)
        ssd_cases(w, gen)
    w.save()
    print(f"{w.offset} values ({4 * w.offset} bytes) in {OUT}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Pagoda's GPTQ against AutoGPTQ's `GPTQ.fasterquant` (auto_gptq 0.7.1) on the same layer.

Two modes:

  check DUMP_DIR NAME [--heldout DIR]
      DUMP_DIR holds what `pagoda quantize --method gptq` wrote for tensor NAME with
      PAGODA_GPTQ_DUMP_DIR=DUMP_DIR PAGODA_GPTQ_DUMP=NAME set (see `dump_for_reference` in
      crates/pagoda-compress/src/quantize/gptq.rs): the weights W, the site's Hessian H
      (2/n XᵀX of the calibration inputs), Pagoda's quantized weights Q and the options.
      Runs AutoGPTQ's fasterquant on the same W and H with the same options (block size 128 as
      the reference, and block size = group size), plain RTN on the same grid, and prints each
      one's output error tr((W-Q) H (W-Q)ᵀ) and how many weights differ from Pagoda's.
      With --heldout DIR (a dump of the same tensor made with `--calibration` on held-out text),
      the errors are also given under the held-out Hessian: how well each result generalises.

  golden OUT.json
      A small random problem (W, X → H) quantized by fasterquant, for the Rust test
      `gptq::tests::matches_autogptq_fasterquant_golden` (no Python needed there).

Venv: /root/.venvs/pagoda-gptq (torch, transformers, auto_gptq 0.7.1). Runs on the CPU:
auto_gptq's package __init__ needs accelerate/CUDA pieces, so only the two quantization files
are loaded, and torch.cuda.synchronize (called unconditionally by fasterquant) is stubbed.
"""

import argparse
import importlib
import json
import os
import sys
import types

import numpy as np
import torch

torch.cuda.synchronize = lambda *a, **k: None


def load_autogptq():
    """auto_gptq.quantization.gptq without running the package's __init__ (it imports the
    model zoo, which needs accelerate and CUDA kernels)."""
    spec = importlib.util.find_spec("auto_gptq")
    if spec is None:
        import glob

        cands = glob.glob("/root/.venvs/pagoda-gptq/lib/python*/site-packages/auto_gptq")
        root = cands[0]
    else:
        root = os.path.dirname(spec.origin)
    for name, path in [("auto_gptq", root), ("auto_gptq.quantization", os.path.join(root, "quantization"))]:
        if name not in sys.modules:
            m = types.ModuleType(name)
            m.__path__ = [path]
            sys.modules[name] = m
    gptq = importlib.import_module("auto_gptq.quantization.gptq")
    quantizer = importlib.import_module("auto_gptq.quantization.quantizer")
    return gptq.GPTQ, quantizer.Quantizer


GPTQ, Quantizer = load_autogptq()


def fasterquant(W, H, nsamples, bits, group_size, sym, act_order, damp, blocksize=128):
    """AutoGPTQ's fasterquant on W [rows, cols] (float32) and H [cols, cols]."""
    rows, cols = W.shape
    layer = torch.nn.Linear(cols, rows, bias=False)
    layer.weight.data = torch.tensor(W, dtype=torch.float32).clone()
    g = GPTQ(layer)
    g.H = torch.tensor(H, dtype=torch.float32).clone()
    g.nsamples = nsamples
    g.quantizer.configure(bits, perchannel=True, sym=sym, mse=False)
    scale, zero, g_idx = g.fasterquant(
        blocksize=blocksize,
        percdamp=damp,
        group_size=group_size,
        actorder=act_order,
        static_groups=False,
    )
    return (
        layer.weight.data.numpy().astype(np.float32),
        scale.numpy().astype(np.float32),
        zero.numpy().astype(np.float32),
        g_idx.numpy(),
    )


def rtn(W, bits, group_size, sym):
    """Round to nearest on AutoGPTQ's grid (Quantizer.find_params per group)."""
    rows, cols = W.shape
    gs = cols if group_size == -1 else group_size
    Q = np.zeros_like(W)
    for c0 in range(0, cols, gs):
        q = Quantizer()
        q.configure(bits, perchannel=True, sym=sym, mse=False)
        w = torch.tensor(W[:, c0 : c0 + gs])
        q.find_params(w, weight=True)
        Q[:, c0 : c0 + gs] = q.quantize(w).numpy()
    return Q


def out_err(W, Q, H):
    D = (W - Q).astype(np.float64)
    return float(np.einsum("ij,jk,ik->", D, H, D))


def load_dump(d, name):
    meta = json.load(open(os.path.join(d, f"{name}.json")))
    r, c = meta["rows"], meta["cols"]
    W = np.fromfile(os.path.join(d, f"{name}.W.f32"), dtype="<f4").reshape(r, c)
    H = np.fromfile(os.path.join(d, f"{name}.H.f64"), dtype="<f8").reshape(c, c)
    Q = np.fromfile(os.path.join(d, f"{name}.Q.f32"), dtype="<f4").reshape(r, c)
    return meta, W, H, Q


def check(args):
    meta, W, H, Qp = load_dump(args.dump, args.name)
    gs, bits, sym = meta["group_size"], meta["bits"], meta["sym"]
    Hh = None
    if args.heldout:
        meta_h, Wh, Hh, _ = load_dump(args.heldout, args.name)
        assert np.array_equal(W, Wh), "the held-out dump has other weights"
    results = {"pagoda": Qp}
    for bs in (128, gs if gs > 0 else 128):
        Qr, _, _, _ = fasterquant(
            W, H, meta["samples"], bits, gs, sym, meta["act_order"], meta["damp"], blocksize=bs
        )
        results[f"autogptq_b{bs}"] = Qr
    results["rtn"] = rtn(W, bits, gs, sym)
    print(f"{args.name}: {meta['rows']}x{meta['cols']}, {meta['samples']} calibration rows, "
          f"{bits}-bit g{gs} {'sym' if sym else 'asym'} act_order={meta['act_order']} damp={meta['damp']}")
    base = out_err(W, results["rtn"], H)
    base_h = out_err(W, results["rtn"], Hh) if Hh is not None else None
    for k, Q in results.items():
        e = out_err(W, Q, H)
        line = f"  {k:>16}: calib err {e:12.5e} ({100 * e / base:6.1f}% of RTN)"
        if Hh is not None:
            eh = out_err(W, Q, Hh)
            line += f"  held-out err {eh:12.5e} ({100 * eh / base_h:6.1f}% of RTN)"
        scale = np.abs(W).max()
        diff = np.abs(Q - Qp) > 1e-3 * scale
        line += f"  differs from pagoda: {100 * diff.mean():5.2f}% of weights"
        print(line)


def golden(args):
    rng = np.random.default_rng(20261203)
    rows, cols, n = 8, 64, 256
    W = rng.standard_normal((rows, cols)).astype(np.float32)
    mix = rng.standard_normal((cols, 4)).astype(np.float32)
    z = rng.standard_normal((n, 4)).astype(np.float32)
    X = z @ mix.T + 0.3 * rng.standard_normal((n, cols)).astype(np.float32)
    X[:, ::7] *= 5.0  # uneven channel magnitudes, as real activations have
    X = X.astype(np.float32)
    H = (2.0 / n) * (X.astype(np.float64).T @ X.astype(np.float64))
    cases = []
    for bits, gs, sym, act in [(4, 16, False, False), (4, 16, True, False), (3, -1, False, False), (4, 16, False, True)]:
        # Block size = group size: every group's grid is fitted on the weights as compensated
        # so far, as Pagoda does (with the reference's default 128 the grids of groups that
        # start inside a block are fitted on values not yet compensated by that block).
        bs = gs if gs > 0 else 128
        Q, scale, zero, g_idx = fasterquant(W, H, n, bits, gs, sym, act, 0.01, blocksize=bs)
        cases.append({
            "bits": bits, "group_size": gs, "sym": sym, "act_order": act, "damp": 0.01,
            "blocksize": bs,
            "q": [float(v) for v in Q.reshape(-1)],
            "g_idx": [int(v) for v in g_idx],
            "error": out_err(W, Q, H),
            "rtn_error": out_err(W, rtn(W, bits, gs, sym), H),
        })
    out = {
        "generator": "scripts/reference/gptq_layer_check.py golden (auto_gptq 0.7.1 GPTQ.fasterquant)",
        "rows": rows, "cols": cols, "samples": n,
        "w": [float(v) for v in W.reshape(-1)],
        "h": [float(v) for v in H.reshape(-1)],
        "cases": cases,
    }
    with open(args.out, "w") as f:
        json.dump(out, f)
    for c in cases:
        print(f"{c['bits']}-bit g{c['group_size']} sym={c['sym']} act={c['act_order']}: "
              f"error {c['error']:.4e} (RTN {c['rtn_error']:.4e})")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("dump")
    c.add_argument("name")
    c.add_argument("--heldout")
    g = sub.add_parser("golden")
    g.add_argument("out")
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    {"check": check, "golden": golden}[a.cmd](a)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Golden masks and weights for Pagoda's pruning (crates/pagoda-compress/src/prune), from a
NumPy re-implementation written from the papers, not from Pagoda's code:

- Wanda (Sun, Liu, Bair, Kolter, "A Simple and Effective Pruning Approach for Large Language
  Models", 2023): score S_ij = |W_ij| * ||X_j||_2, compared within each output row (each row
  prunes the same fraction); N:M prunes the M - N lowest scores of every M consecutive inputs.
- SparseGPT (Frantar & Alistarh, "SparseGPT: Massive Language Models Can Be Accurately
  Pruned in One-Shot", 2023), Algorithm 1: H = 2/n X^T X dampened by 1 % of its mean diagonal,
  Hinv = the upper Cholesky factor of H^-1; columns in blocks of B = 128; at a block's start the
  mask of the block is the fraction p of smallest w^2 / [Hinv]_jj^2 over the block (all
  rows); for N:M, at every M-th column the M - N smallest of the next M columns in each row;
  each column's error (w - mask*w) / [Hinv]_jj is subtracted from the later columns,
  times the row of Hinv (lazy batch updates across blocks).

One deviation from the authors' code, made the same on both sides: the block's unstructured
mask takes exactly floor(p * numel) weights (the authors' `tmp <= sorted[int(p * numel)]`
takes one more). Ties break by the lower (row-major) index: argsort(kind="stable").

Writes tests/golden/prune_layer.json: the layer W [16, 192], the calibration inputs X [64, 192]
(float32 values), Wanda's masks (unstructured 50 %, 2:4, 4:8) and SparseGPT's masks and
pruned weights (unstructured 50 %, 2:4). Run: python3 scripts/golden_prune.py
"""
import json
import os

import numpy as np

ROWS, COLS, N = 16, 192, 64
BLOCK, DAMP = 128, 0.01


def smallest(scores, k):
    return np.argsort(scores, kind="stable")[:k]


def rowwise_mask(scores, pattern, sparsity):
    rows, cols = scores.shape
    mask = np.zeros_like(scores, dtype=bool)
    for r in range(rows):
        if pattern is None:
            mask[r, smallest(scores[r], int(np.floor(sparsity * cols)))] = True
        else:
            n, m = pattern
            for g in range(0, cols, m):
                mask[r, g + smallest(scores[r, g:g + m], m - n)] = True
    return mask


def wanda_mask(W, X, pattern, sparsity):
    norms = np.linalg.norm(X.astype(np.float64), axis=0)
    return rowwise_mask(np.abs(W.astype(np.float64)) * norms[None, :], pattern, sparsity)


def sparsegpt(W, X, pattern, sparsity):
    W = W.astype(np.float64).copy()
    X = X.astype(np.float64)
    rows, cols = W.shape
    H = 2.0 / X.shape[0] * X.T @ X
    dead = np.diag(H) == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    H = H + DAMP * np.mean(np.diag(H)) * np.eye(cols)
    Hinv = np.linalg.cholesky(np.linalg.inv(H)).T  # upper: H^-1 = U^T U
    d = np.diag(Hinv)
    for b0 in range(0, cols, BLOCK):
        b1 = min(b0 + BLOCK, cols)
        bw = b1 - b0
        W1 = W[:, b0:b1].copy()
        Err1 = np.zeros_like(W1)
        mask1 = np.zeros_like(W1, dtype=bool)
        if pattern is None:
            tmp = W1 ** 2 / d[None, b0:b1] ** 2
            k = int(np.floor(sparsity * tmp.size))
            flat = smallest(tmp.reshape(-1), k)
            mask1.reshape(-1)[flat] = True
        for i in range(bw):
            if pattern is not None:
                n, m = pattern
                if i % m == 0:
                    tmp = W1[:, i:i + m] ** 2 / d[None, b0 + i:b0 + i + m] ** 2
                    for r in range(rows):
                        mask1[r, i + smallest(tmp[r], m - n)] = True
            w = W1[:, i]
            q = np.where(mask1[:, i], 0.0, w)
            err = (w - q) / Hinv[b0 + i, b0 + i]
            W1[:, i:] -= np.outer(err, Hinv[b0 + i, b0 + i:b1])
            W1[:, i] = q
            Err1[:, i] = err
        W[:, b0:b1] = W1
        W[:, b1:] -= Err1 @ Hinv[b0:b1, b1:]
    return W


def f32_list(a):
    # The shortest decimal that reads back as the same float32 (keeps the file small).
    return [float(str(np.float32(v))) for v in a.reshape(-1)]


def bits(mask):
    return ["".join("1" if v else "0" for v in row) for row in mask]


def main():
    rng = np.random.default_rng(24)
    W = (rng.standard_normal((ROWS, COLS)) * 0.1).astype(np.float32)
    # Channels of very different scales, as LLM activations have (outlier features).
    scales = np.exp(rng.standard_normal(COLS) * 1.0)
    X = (rng.standard_normal((N, COLS)) * scales[None, :]).astype(np.float32)
    out = {
        "source": "scripts/golden_prune.py (NumPy, from the Wanda and SparseGPT papers)",
        "rows": ROWS,
        "cols": COLS,
        "block": BLOCK,
        "damp": DAMP,
        "w": f32_list(W),
        "x": f32_list(X),
        "wanda": {},
        "sparsegpt": {},
    }
    for name, pattern in [("unstructured", None), ("2:4", (2, 4)), ("4:8", (4, 8))]:
        out["wanda"][name] = bits(wanda_mask(W, X, pattern, 0.5))
    for name, pattern in [("unstructured", None), ("2:4", (2, 4))]:
        Wp = sparsegpt(W, X, pattern, 0.5)
        out["sparsegpt"][name] = {"mask": bits(Wp == 0.0), "w": [float(f"{v:.9g}") for v in Wp.reshape(-1)]}
    path = os.path.join(os.path.dirname(__file__), "..", "tests", "golden", "prune_layer.json")
    with open(path, "w") as f:
        json.dump(out, f)
    print("wrote", os.path.normpath(path))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Every SVG plot Pagoda writes, drawn by headless Chromium with its real fonts: the chart's
title and every tick label and axis title lie inside the SVG's box (getBBox() of each text
element against the viewBox), and each axis has at least two tick labels and a title.

The plots are made with the CLI on the tiny golden Llama (tests/golden/tiny-llama), as a user
makes them:
- `pagoda eval report --plot` (size against perplexity; also what `pagoda compress` writes);
- `pagoda bench serve --plot` against a `pagoda serve` of the same model (its title names the
  server's URL, the model, the data set and the arrivals: the long title that was clipped);
and the committed plots under docs/img (every *.svg there).

Usage: svg_plots.py --pagoda target/debug/pagoda [--chromium chromium] [--keep DIR] [SVG...]
Needs Debian's `chromium`. Exits 1 when a check fails.
"""

import argparse
import glob
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server import Server, check, failures  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TINY = os.path.join(ROOT, "tests", "golden", "tiny-llama")

# Runs in the page: for each <svg> in the document, every text element's box (getBBox in
# the SVG's user units, through its transform) against the viewBox.
MEASURE = r"""
const out = [];
for (const wrap of document.querySelectorAll('div.plot')) {
  const svg = wrap.querySelector('svg');
  const vb = svg.viewBox.baseVal;
  const texts = [];
  for (const t of svg.querySelectorAll('text')) {
    const b = t.getBBox();
    const m = t.getCTM();
    const inv = svg.getCTM().inverse();
    const pts = [[b.x, b.y], [b.x + b.width, b.y], [b.x, b.y + b.height],
                 [b.x + b.width, b.y + b.height]].map(([x, y]) => {
      const p = new DOMPoint(x, y).matrixTransform(m).matrixTransform(inv);
      return [p.x, p.y];
    });
    const xs = pts.map(p => p[0]), ys = pts.map(p => p[1]);
    texts.push({text: t.textContent, cls: t.getAttribute('class') || '',
                axis: t.getAttribute('data-axis') || '',
                x0: Math.min(...xs), x1: Math.max(...xs),
                y0: Math.min(...ys), y1: Math.max(...ys)});
  }
  out.push({name: wrap.dataset.name, w: vb.width, h: vb.height, texts});
}
document.getElementById('result').textContent = JSON.stringify(out);
"""


def measure(chromium, svgs):
    """Each SVG's text boxes as Chromium lays them out: [{name, w, h, texts}]."""
    body = "".join(
        f'<div class="plot" data-name="{html.escape(name)}">{re.sub(r"<[?]xml[^>]*>", "", text)}</div>'
        for name, text in svgs)
    page = (f"<!doctype html><html><body>{body}<pre id=\"result\"></pre>"
            f"<script>{MEASURE}</script></body></html>")
    tmp = tempfile.mkdtemp(prefix="pagoda-svg-")
    path = os.path.join(tmp, "plots.html")
    with open(path, "w") as f:
        f.write(page)
    profile = os.path.join(tmp, "profile")
    try:
        dom = subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--disable-background-networking", f"--user-data-dir={profile}",
             "--virtual-time-budget=5000", "--dump-dom", "file://" + path],
            capture_output=True, text=True, timeout=120, check=True).stdout
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    m = re.search(r'<pre id="result">(.*?)</pre>', dom, re.S)
    if not m or not m.group(1).strip():
        raise RuntimeError("the page measured nothing:\n" + dom[-2000:])
    return json.loads(html.unescape(m.group(1)))


def check_plot(plot):
    """The title, tick labels and axis titles inside the box; two labelled ticks and a title
    per axis."""
    eps = 0.5
    outside = [t for t in plot["texts"]
               if t["x0"] < -eps or t["y0"] < -eps or t["x1"] > plot["w"] + eps
               or t["y1"] > plot["h"] + eps]
    assert not outside, "outside the {} x {} box: {}".format(plot["w"], plot["h"], "; ".join(
        f"{t['cls'] or 'text'} {t['text']!r} at x {t['x0']:.1f}..{t['x1']:.1f} "
        f"y {t['y0']:.1f}..{t['y1']:.1f}" for t in outside))
    titles = [t for t in plot["texts"] if t["cls"] == "title" and t["text"].strip()]
    assert titles, "no title"
    axes = {}
    for t in plot["texts"]:
        if t["cls"] in ("tick-label", "axis-title") and t["axis"]:
            axes.setdefault(t["axis"], {"tick-label": 0, "axis-title": 0})[t["cls"]] += 1
    assert len(axes) >= 2, f"axes: {sorted(axes)}"
    for name, n in axes.items():
        assert n["tick-label"] >= 2, f"axis {name}: {n['tick-label']} tick labels"
        assert n["axis-title"] == 1, f"axis {name}: {n['axis-title']} titles"


def make_plots(pagoda, out):
    """The plots the CLI writes, made on the tiny model into `out`; their paths."""
    store = os.path.join(out, "store")
    report_svg = os.path.join(out, "eval-report.svg")
    subprocess.run(
        [pagoda, "--store", store, "eval", "report", "--baseline", TINY,
         "--variant", TINY + ":q8_0", "--variant", TINY + ":q4_0", "--ppl-ctx", "64",
         "--prompt-tokens", "16", "--gen-tokens", "4", "--repeat", "1",
         "-o", os.path.join(out, "report.md"), "--plot", report_svg],
        check=True, capture_output=True)
    bench_svg = os.path.join(out, "bench-serve.svg")
    server = Server(pagoda, TINY)
    try:
        subprocess.run(
            [pagoda, "bench", "serve", "--url", server.url, "--model", TINY,
             "--dataset", "random", "--input-len", "16", "--max-tokens", "8",
             "--num-requests", "24", "--concurrency", "4", "--warmup", "1",
             "--plot", bench_svg],
            check=True, capture_output=True)
    finally:
        server.stop()
    return [report_svg, bench_svg]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pagoda", required=True)
    ap.add_argument("--chromium", default="chromium")
    ap.add_argument("--keep", help="copy the plots made to this folder")
    ap.add_argument("svg", nargs="*", help="more SVG files to check")
    args = ap.parse_args()
    out = tempfile.mkdtemp(prefix="pagoda-plots-")
    paths = []
    check("the CLI writes its plots on the tiny model", lambda: paths.extend(make_plots(args.pagoda, out)))
    paths += sorted(glob.glob(os.path.join(ROOT, "docs", "img", "*.svg"))) + args.svg
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
        for p in paths:
            if p.startswith(out):
                shutil.copy(p, args.keep)
    svgs = []
    for p in paths:
        with open(p) as f:
            svgs.append((os.path.relpath(p, ROOT) if p.startswith(ROOT) else os.path.basename(p), f.read()))
    plots = []
    check(f"Chromium lays out {len(svgs)} plots", lambda: plots.extend(measure(args.chromium, svgs)))
    for plot in plots:
        check(f"{plot['name']}: title, tick labels and axis titles inside the box, every axis "
              "ticked and titled", lambda plot=plot: check_plot(plot))
    shutil.rmtree(out, ignore_errors=True)
    if failures:
        print(f"{len(failures)} check(s) failed: {', '.join(failures)}")
        sys.exit(1)


if __name__ == "__main__":
    main()

"""The ratio to plain prefill against batch shape, drawn from a report of gpu_batch_shapes.py, as an SVG.

    python benchmarks/plot_batch_shapes.py reports/gpu/<date>-batch-shapes-<shape>-<tag>.json docs/img/batch-shapes.svg

One group of bars per batch shape (in the report's order), one bar per round (speculators' loop, the fast path, the
fast path with the states on the device) at the median ratio, a whisker from the smallest to the largest pair, and
lines at 1.0 (as fast as plain prefill) and 0.95. Plain SVG, no plotting library: the page needs no build step.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

COLOURS = {"loop": "#9aa5b1", "fast-waited": "#8fb3d9", "fast": "#2f6fb0", "fast-device": "#e07b26"}
LABELS = {
    "loop": "speculators' loop",
    "fast-waited": "fast path, follow-ups waited for",
    "fast": "fast path",
    "fast-device": "fast path, states on the GPU",
}
WIDTH, HEIGHT, LEFT, BOTTOM, TOP = 760, 340, 56, 60, 40
LOW, HIGH = 0.6, 1.4  # the ratio axis


def svg(report: dict) -> str:
    batches = report["batches"]
    rounds = [r for r in COLOURS if any(r in b["rounds"] for b in batches)]
    plot_w, plot_h = WIDTH - LEFT - 20, HEIGHT - BOTTOM - TOP
    group = plot_w / max(1, len(batches))
    bar = group * 0.8 / max(1, len(rounds))

    def y(ratio: float) -> float:
        ratio = min(max(ratio, LOW), HIGH)
        return TOP + plot_h * (HIGH - ratio) / (HIGH - LOW)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" '
        f'font-size="12">',
        f'<text x="{LEFT}" y="18" font-size="13">Extraction ÷ plain prefill by batch shape: {report["shape"]}, '
        f"{report['gpu']}, {report['pairs']} pairs a round (median, min–max)</text>",
    ]
    for tick in (0.6, 0.8, 0.9, 0.95, 1.0, 1.2, 1.4):
        dash = ' stroke-dasharray="4 3"' if tick in (0.95, 1.0) else ""
        out.append(f'<line x1="{LEFT}" x2="{WIDTH - 20}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" stroke="#ccc"{dash}/>')
        out.append(f'<text x="{LEFT - 6}" y="{y(tick) + 4:.1f}" text-anchor="end">{tick:g}</text>')
    for i, b in enumerate(batches):
        x0 = LEFT + i * group + group * 0.1
        for j, name in enumerate(rounds):
            r = b["rounds"].get(name)
            if r is None:
                continue
            ratio = r["ratio"]
            x = x0 + j * bar
            out.append(
                f'<rect x="{x:.1f}" y="{y(ratio["median"]):.1f}" width="{bar * 0.9:.1f}" '
                f'height="{y(LOW) - y(ratio["median"]):.1f}" fill="{COLOURS[name]}"/>'
            )
            mid = x + bar * 0.45
            out.append(
                f'<line x1="{mid:.1f}" x2="{mid:.1f}" y1="{y(ratio["min"]):.1f}" y2="{y(ratio["max"]):.1f}" '
                f'stroke="#222"/>'
            )
        out.append(
            f'<text x="{x0 + group * 0.4:.1f}" y="{HEIGHT - BOTTOM + 18}" text-anchor="middle">{b["batch"]}</text>'
        )
        out.append(
            f'<text x="{x0 + group * 0.4:.1f}" y="{HEIGHT - BOTTOM + 32}" text-anchor="middle" fill="#666">'
            f"{b['tokens']:,} tokens</text>"
        )
    for k, name in enumerate(rounds):
        lx = LEFT + k * 220
        out.append(f'<rect x="{lx}" y="{HEIGHT - 16}" width="12" height="12" fill="{COLOURS[name]}"/>')
        out.append(f'<text x="{lx + 16}" y="{HEIGHT - 6}">{LABELS[name]}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: plot_batch_shapes.py REPORT.json OUT.svg", file=sys.stderr)
        return 2
    try:
        report = json.loads(Path(args[0]).read_text())
        report["batches"][0]["rounds"]
    except (OSError, ValueError, KeyError, IndexError) as exc:
        print(f"{args[0]}: not a report of gpu_batch_shapes.py ({type(exc).__name__}: {exc})", file=sys.stderr)
        return 2
    Path(args[1]).parent.mkdir(parents=True, exist_ok=True)
    Path(args[1]).write_text(svg(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

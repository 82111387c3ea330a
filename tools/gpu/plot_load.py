#!/usr/bin/env python3
"""Issue 14: turns the RESULT lines of ckpt-bench-load (tools/gpu/warm_huge.sh) into a
markdown table (best of the runs, GiB/s) and an SVG plot of warm load throughput against
thread count, 4 KiB vs huge pages, with the single-threaded baselines as flat lines. The
SVG is written by hand: no matplotlib needed.
    plot_load.py LOG --svg OUT.svg --markdown OUT.md
"""
import argparse
import collections
import re

ap = argparse.ArgumentParser()
ap.add_argument("log")
ap.add_argument("--svg", required=True)
ap.add_argument("--markdown", required=True)
a = ap.parse_args()

best = collections.defaultdict(float)  # (tag, mode, label) -> best GiB/s
threads = {}
for line in open(a.log):
    m = re.match(r"RESULT (\S+) (warm|cold) (\S+) (\d+) ([\d.]+)", line)
    if not m:
        continue
    key = (m[1], m[2], m[3])
    best[key] = max(best[key], float(m[5]))
    threads[key] = int(m[4])

md = ["| pages | mode | what | threads | GiB/s (best) |", "|---|---|---|---:|---:|"]
for key in sorted(best, key=lambda k: (k[1] != "warm", k[0], not k[2].startswith("pread"), threads[k], k[2])):
    md.append(f"| {key[0]} | {key[1]} | {key[2]} | {threads[key]} | {best[key]:.2f} |")
open(a.markdown, "w").write("\n".join(md) + "\n")

# The plot: x = threads (log2), y = GiB/s.
W, H, L, R, T, B = 720, 420, 60, 210, 30, 50
xs = [1, 2, 4, 8, 16]
series = {}
for tag, colour, light in (("4k", "#d62728", "#ff9896"), ("huge", "#1f77b4", "#aec7e8")):
    pts = [(t, best.get((tag, "warm", f"pread:{t}"), 0)) for t in xs]
    series[f"{tag}, populate first"] = (colour, [p for p in pts if p[1] > 0])
    for suffix, what in ((":deferred", "populate per read"), (":fallocate", "posix_fallocate")):
        pts = [(t, best.get((tag, "warm", f"pread:{t}{suffix}"), 0)) for t in xs]
        if any(v > 0 for _, v in pts):
            series[f"{tag}, {what}"] = (light if suffix == ":deferred" else colour, [p for p in pts if p[1] > 0])
flat = {
    "cp (huge tmpfs)": ("#2ca02c", best.get(("huge", "warm", "cp"), 0)),
    "cp (4 KiB tmpfs)": ("#98df8a", best.get(("4k", "warm", "cp"), 0)),
    "read() into buffer": ("#7f7f7f", max(best.get(("4k", "warm", "read"), 0), best.get(("huge", "warm", "read"), 0))),
}
ymax = max([v for _, pts in series.values() for _, v in pts] + [v for _, v in flat.values()] + [1]) * 1.1
def X(t):
    return L + (W - L - R) * (xs.index(t) / (len(xs) - 1))
def Y(v):
    return T + (H - T - B) * (1 - v / ymax)
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
       f'<rect width="{W}" height="{H}" fill="white"/>',
       f'<text x="{L}" y="18" font-size="14">Warm load of the 9.88 GiB checkpoint into a segment (16-core H200 host)</text>']
for i in range(6):
    v = ymax * i / 5
    svg.append(f'<line x1="{L}" x2="{W - R}" y1="{Y(v):.1f}" y2="{Y(v):.1f}" stroke="#ddd"/>')
    svg.append(f'<text x="{L - 6}" y="{Y(v) + 4:.1f}" text-anchor="end">{v:.0f}</text>')
for t in xs:
    svg.append(f'<text x="{X(t):.1f}" y="{H - B + 18}" text-anchor="middle">{t}</text>')
svg.append(f'<text x="{(L + W - R) / 2}" y="{H - 12}" text-anchor="middle">loader threads</text>')
svg.append(f'<text x="16" y="{(T + H - B) / 2}" transform="rotate(-90 16 {(T + H - B) / 2})" text-anchor="middle">GiB/s</text>')
legend_y = T + 10
for name, (colour, v) in flat.items():
    if v <= 0:
        continue
    svg.append(f'<line x1="{L}" x2="{W - R}" y1="{Y(v):.1f}" y2="{Y(v):.1f}" stroke="{colour}" stroke-dasharray="6 4"/>')
    svg.append(f'<line x1="{W - R + 10}" x2="{W - R + 30}" y1="{legend_y}" y2="{legend_y}" stroke="{colour}" stroke-dasharray="6 4"/>')
    svg.append(f'<text x="{W - R + 35}" y="{legend_y + 4}">{name}</text>')
    legend_y += 18
for name, (colour, pts) in series.items():
    if not pts:
        continue
    path = " ".join(f"{X(t):.1f},{Y(v):.1f}" for t, v in pts)
    svg.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
    for t, v in pts:
        if "fallocate" in name:
            svg.append(f'<rect x="{X(t) - 5:.1f}" y="{Y(v) - 5:.1f}" width="10" height="10" fill="{colour}"/>')
        else:
            svg.append(f'<circle cx="{X(t):.1f}" cy="{Y(v):.1f}" r="3" fill="{colour}"/>')
    svg.append(f'<line x1="{W - R + 10}" x2="{W - R + 30}" y1="{legend_y}" y2="{legend_y}" stroke="{colour}" stroke-width="2"/>')
    svg.append(f'<text x="{W - R + 35}" y="{legend_y + 4}">{name}</text>')
    legend_y += 18
svg.append("</svg>")
open(a.svg, "w").write("\n".join(svg) + "\n")

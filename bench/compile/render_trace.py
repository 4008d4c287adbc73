#!/usr/bin/env python3
"""Draws a `planc compile --trace` Chrome trace as a PNG (no dependencies beyond the standard
library): one row per rank, forward slices blue, backward green, pipeline transfers orange,
gradient reduction red, optimizer purple. Usage: render_trace.py TRACE.json OUT.png [WIDTH]"""
import json, struct, sys, zlib

COLORS = {"F": (66, 133, 244), "B": (52, 168, 83), "pipeline": (251, 140, 0),
          "data-parallel": (219, 68, 55), "optimizer": (142, 36, 170)}


def main():
    trace = json.load(open(sys.argv[1]))
    width = int(sys.argv[3]) if len(sys.argv) > 3 else 1600
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    rows = sorted({e["tid"] for e in events})
    end = max(e["ts"] + e["dur"] for e in events)
    row_h, gap, margin = 18, 4, 10
    height = margin * 2 + len(rows) * (row_h + gap)
    img = [[(255, 255, 255)] * width for _ in range(height)]
    scale = (width - 2 * margin) / end
    for e in events:
        color = COLORS.get(e.get("cat") if e.get("cat") != "compute" else e["name"][0], (120, 120, 120))
        y0 = margin + rows.index(e["tid"]) * (row_h + gap)
        inset = 5 if e.get("cat") == "pipeline" else 0  # transfers as thin bars
        x0 = margin + int(e["ts"] * scale)
        x1 = max(x0 + 1, margin + int((e["ts"] + e["dur"]) * scale) - 1)
        for y in range(y0 + inset, y0 + row_h - inset):
            row = img[y]
            for x in range(x0, min(x1, width)):
                row[x] = color
    raw = b"".join(b"\x00" + bytes(c for px in row for c in px) for row in img)
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
    open(sys.argv[2], "wb").write(png)
    print(f"{sys.argv[2]}: {len(rows)} rows, {len(events)} slices, step {end / 1e6:.3f} s")


if __name__ == "__main__":
    main()

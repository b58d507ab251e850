#!/usr/bin/env python3
"""Checks `llmtrain plot`'s images with the standard library only, independently of cairo.

  plot_check.py png FILE WIDTH HEIGHT [#rrggbb ...]
      A valid PNG (signature, every chunk's CRC, IHDR, IEND, the zlib stream inflated and every
      scanline's filter undone) of WIDTH x HEIGHT, mostly white, holding pixels of each colour; and
      the first colour's curve falls from left to right (the y axis grows upwards).
  plot_check.py svg FILE TITLE NAME...
      Well-formed XML whose root is <svg>, with <path> elements, TITLE as its <title> and every
      NAME in its <title>/<desc> text.
Exits 1 with the reason on the first failure.
"""
import struct
import sys
import xml.etree.ElementTree as ET
import zlib


def fail(msg):
    print(f"plot_check: {msg}")
    sys.exit(1)


def read_png(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail(f"{path}: no PNG signature")
    pos, chunks = 8, []
    while pos < len(data):
        if pos + 12 > len(data):
            fail(f"{path}: truncated chunk at byte {pos}")
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        if zlib.crc32(kind + body) != crc:
            fail(f"{path}: bad CRC in chunk {kind!r}")
        chunks.append((kind, body))
        pos += 12 + length
    if chunks[0][0] != b"IHDR" or chunks[-1][0] != b"IEND":
        fail(f"{path}: chunks do not run from IHDR to IEND")
    width, height, depth, colour_type, _, _, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    if depth != 8 or colour_type not in (2, 6) or interlace != 0:
        fail(f"{path}: depth {depth}, colour type {colour_type}, interlace {interlace}: not 8-bit RGB(A)")
    channels = 3 if colour_type == 2 else 4
    raw = zlib.decompress(b"".join(body for kind, body in chunks if kind == b"IDAT"))
    stride = width * channels
    if len(raw) != height * (stride + 1):
        fail(f"{path}: {len(raw)} bytes of scanlines for {width}x{height}")
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if f == 1:
                line[i] = (line[i] + a) & 0xFF
            elif f == 2:
                line[i] = (line[i] + b) & 0xFF
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pred) & 0xFF
            elif f != 0:
                fail(f"{path}: row {y}: unknown filter {f}")
        rows.append(line)
        prev = line
    pixels = [[tuple(row[x * channels:x * channels + 3]) for x in range(width)] for row in rows]
    return width, height, pixels


def check_png(path, width, height, colours):
    w, h, pixels = read_png(path)
    if (w, h) != (width, height):
        fail(f"{path}: {w}x{h}, expected {width}x{height}")
    white = sum(p == (255, 255, 255) for row in pixels for p in row)
    if not 0.5 < white / (w * h) < 0.995:
        fail(f"{path}: {white / (w * h):.1%} white: expected a chart on a white background")
    for n, hexcolour in enumerate(colours):
        want = tuple(int(hexcolour[i:i + 2], 16) for i in (1, 3, 5))
        hits = [(x, y) for y, row in enumerate(pixels) for x, p in enumerate(row)
                if max(abs(p[k] - want[k]) for k in range(3)) <= 24]
        if len(hits) < 30:
            fail(f"{path}: {len(hits)} pixels of {hexcolour}: its run is not drawn")
        if n == 0:
            # The first run's loss falls: its pixels sit higher (smaller y) on the left of the
            # chart's first panel than on the right. The legend is right of the plotting area.
            left = [y for x, y in hits if x < w * 0.3 and y < 600]
            right = [y for x, y in hits if w * 0.5 < x < w * 0.7 and y < 600]
            if not left or not right or sum(left) / len(left) >= sum(right) / len(right):
                fail(f"{path}: the curve of {hexcolour} does not fall from left to right")
    print(f"plot_check: {path}: PNG {w}x{h}, colours {' '.join(colours)} drawn")


def check_svg(path, title, names):
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:
        fail(f"{path}: not well-formed XML: {e}")
    if not root.tag.endswith("}svg") and root.tag != "svg":
        fail(f"{path}: the root element is {root.tag}, not svg")
    paths = [e for e in root.iter() if e.tag.endswith("path")]
    if len(paths) < 10:
        fail(f"{path}: {len(paths)} <path> elements: nothing drawn")
    titles = [e for e in root if e.tag.endswith("title")]
    if not titles or titles[0].text != title:
        fail(f"{path}: <title> is {titles[0].text if titles else None!r}, expected {title!r}")
    text = " ".join(t for e in root if e.tag.endswith(("title", "desc")) for t in e.itertext())
    for name in names:
        if name not in text:
            fail(f"{path}: the run name {name!r} is not in its title/description: {text!r}")
    print(f"plot_check: {path}: SVG with {len(paths)} paths, titled {title!r}, naming {', '.join(names)}")


if __name__ == "__main__":
    if len(sys.argv) >= 5 and sys.argv[1] == "png":
        check_png(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:])
    elif len(sys.argv) >= 4 and sys.argv[1] == "svg":
        check_svg(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        fail("usage: plot_check.py png FILE W H [#rrggbb...] | svg FILE TITLE NAME...")

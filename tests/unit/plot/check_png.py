#!/usr/bin/env python3
"""Decodes a PNG written by actpage (8-bit palette) with nothing but Python's zlib, and checks it.

usage: check_png.py FILE [--size WxH] [--colour R,G,B ...] [--min-ink FRACTION]

Exit 0 when the file decodes (signature, chunk CRCs, zlib stream, row filters), has the given size,
more than FRACTION of its pixels differ from the background (the most common colour), and every
--colour is used by at least 50 pixels; otherwise exit 1 saying which check failed.
"""
import argparse
import struct
import sys
import zlib


def decode(data):
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG signature")
    at, chunks = 8, []
    while at < len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length:at + 12 + length])
        if zlib.crc32(kind + body) != crc:
            raise ValueError(f"bad CRC in chunk {kind!r}")
        chunks.append((kind, body))
        at += 12 + length
    ihdr = dict(chunks)[b"IHDR"]
    width, height, depth, colour_type, _, _, interlace = struct.unpack(">IIBBBBB", ihdr)
    if (depth, colour_type, interlace) != (8, 3, 0):
        raise ValueError(f"expected 8-bit palette, not interlaced; got depth {depth} type {colour_type}")
    palette_bytes = dict(chunks)[b"PLTE"]
    palette = [tuple(palette_bytes[i:i + 3]) for i in range(0, len(palette_bytes), 3)]
    raw = zlib.decompress(b"".join(body for kind, body in chunks if kind == b"IDAT"))
    if len(raw) != height * (width + 1):
        raise ValueError(f"decompressed {len(raw)} bytes, expected {height * (width + 1)}")
    pixels = []
    for y in range(height):
        row = raw[y * (width + 1):(y + 1) * (width + 1)]
        if row[0] != 0:
            raise ValueError(f"row {y} uses filter {row[0]}; actpage writes filter 0 only")
        pixels.extend(row[1:])
    return width, height, palette, pixels


def main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("file")
    parser.add_argument("--size")
    parser.add_argument("--colour", action="append", default=[])
    parser.add_argument("--min-ink", type=float, default=0.05)
    args = parser.parse_args(argv)
    with open(args.file, "rb") as f:
        width, height, palette, pixels = decode(f.read())
    problems = []
    if args.size and f"{width}x{height}" != args.size:
        problems.append(f"size {width}x{height}, expected {args.size}")
    counts = [0] * len(palette)
    for index in pixels:
        counts[index] += 1
    background = max(range(len(palette)), key=lambda i: counts[i])
    ink = 1 - counts[background] / len(pixels)
    if ink <= args.min_ink:
        problems.append(f"only {ink:.1%} of the pixels differ from the background")
    for colour in args.colour:
        rgb = tuple(int(part) for part in colour.split(","))
        used = sum(counts[i] for i, entry in enumerate(palette) if entry == rgb)
        if used < 50:
            problems.append(f"colour {colour} used by {used} pixels")
    for problem in problems:
        print(f"{args.file}: {problem}")
    if not problems:
        print(f"{args.file}: {width}x{height}, {len(palette)} colours, {ink:.1%} ink: ok")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Draws the kernel's logo (a 3x3 mesh of linked nodes on a rounded square) as the SVG and the
two PNG sizes Jupyter's launchers look for in a kernelspec, when `python -m xmesh.kernel install`
writes one; no imaging library needed (PNG written with zlib)."""
import math
import os
import struct
import zlib

BACKGROUND = (0x1F, 0x4E, 0x79)  # the square
NODE = (0xF2, 0xA9, 0x00)        # the nodes
LINK = (0xDC, 0xE6, 0xF0)        # the links between neighbours
NODES = [(x, y) for y in (0.28, 0.5, 0.72) for x in (0.28, 0.5, 0.72)]
LINKS = [(a, b) for a in range(9) for b in range(9)
         if a < b and (abs(a % 3 - b % 3) + abs(a // 3 - b // 3)) == 1]
NODE_R, LINK_W, CORNER = 0.075, 0.035, 0.18


def _segment_distance(px, py, ax, ay, bx, by):
    dx, dy = bx - ax, by - ay
    t = max(0.0, min(1.0, ((px - ax) * dx + (py - ay) * dy) / (dx * dx + dy * dy)))
    return math.hypot(px - ax - t * dx, py - ay - t * dy)


def _inside_square(x, y):
    cx, cy = min(max(x, CORNER), 1 - CORNER), min(max(y, CORNER), 1 - CORNER)
    return math.hypot(x - cx, y - cy) <= CORNER


def _color_at(x, y):
    """RGBA of one sample point (coordinates in 0..1)."""
    if not _inside_square(x, y):
        return (0, 0, 0, 0)
    if any(math.hypot(x - nx, y - ny) <= NODE_R for nx, ny in NODES):
        return NODE + (255,)
    if any(_segment_distance(x, y, *NODES[a], *NODES[b]) <= LINK_W / 2 for a, b in LINKS):
        return LINK + (255,)
    return BACKGROUND + (255,)


def png(size, samples=4):
    rows = []
    for j in range(size):
        row = bytearray([0])  # filter type: none
        for i in range(size):
            acc = [0, 0, 0, 0]
            for sj in range(samples):
                for si in range(samples):
                    c = _color_at((i + (si + 0.5) / samples) / size, (j + (sj + 0.5) / samples) / size)
                    for k in range(3):
                        acc[k] += c[k] * c[3]
                    acc[3] += c[3]
            alpha = acc[3] / (samples * samples)
            row += bytes(round(acc[k] / acc[3]) if acc[3] else 0 for k in range(3)) + bytes([round(alpha)])
        rows.append(bytes(row))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", size, size, 8, 6, 0, 0, 0)  # 8-bit RGBA
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"".join(rows), 9)) + \
        chunk(b"IEND", b"")


def svg():
    def hexc(c):
        return "#%02x%02x%02x" % c

    parts = ['<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 100 100" width="100" height="100">',
             f'<rect width="100" height="100" rx="{CORNER * 100:g}" fill="{hexc(BACKGROUND)}"/>']
    for a, b in LINKS:
        (x1, y1), (x2, y2) = NODES[a], NODES[b]
        parts.append(f'<line x1="{x1 * 100:g}" y1="{y1 * 100:g}" x2="{x2 * 100:g}" y2="{y2 * 100:g}" '
                     f'stroke="{hexc(LINK)}" stroke-width="{LINK_W * 100:g}"/>')
    for x, y in NODES:
        parts.append(f'<circle cx="{x * 100:g}" cy="{y * 100:g}" r="{NODE_R * 100:g}" fill="{hexc(NODE)}"/>')
    return "\n".join(parts + ["</svg>\n"])


def write_logos(directory: str) -> None:
    """logo-32x32.png, logo-64x64.png and logo-svg.svg into a kernelspec's directory."""
    for size in (32, 64):
        with open(os.path.join(directory, f"logo-{size}x{size}.png"), "wb") as f:
            f.write(png(size))
    with open(os.path.join(directory, "logo-svg.svg"), "w") as f:
        f.write(svg())

"""Draw the architecture as Figure 1 of the paper draws it, each box linked to the three styles' code.

    python -m scripts.architecture        # writes docs/images/architecture.svg

The boxes are Figure 1's (embeddings, positional encodings, the encoder's and the decoder's N
layers, the generator), plus the final LayerNorm that ends each stack in the one architecture.
Each box names the concept of the README's concept map it draws and links, for explicit, einsum
and mathfirst, the line of the first symbol that row names for that style (read from the live
source, as ``scripts.concept_map`` reads it). Open the SVG itself (not through an ``<img>``) to
follow the links. The picture is written by code, not drawn by hand, so a test can regenerate it
and find it stale when a symbol moves.
"""

from __future__ import annotations

import html
import itertools
import sys
from dataclasses import dataclass
from pathlib import Path

from common.cli import Parser, first_line
from scripts.concept_map import ROOT, STYLES, Concept, concepts, plain

PICTURE = Path("docs/images/architecture.svg")
COMMAND = "python -m scripts.architecture"
# links are relative to the picture's folder
TO_ROOT = "../../"

WIDTH, HEIGHT = 760, 680
BOX_WIDTH, BOX_HEIGHT = 250, 44
ENCODER_X, DECODER_X = 70, 440
FILL = {"embedding": "#fce4ec", "position": "#ffffff", "attention": "#ffe0b2", "norm": "#fff9c4",
        "feed-forward": "#bbdefb", "generator": "#d1c4e9"}


@dataclass(frozen=True)
class Box:
    """One box of the picture: where it stands, what it says, which concept map row it draws."""

    label: str
    concept: str  # the start of a concept map row's title
    kind: str  # a key of FILL
    x: int
    y: int  # the box's top


def layer_boxes(x: int, top: int, sublayers: list[tuple[str, str, str]]) -> list[Box]:
    """A stack's layer, drawn from the bottom up as Figure 1 draws it: each sublayer, then its Add & Norm."""
    boxes, y = [], top
    for label, concept, kind in reversed(sublayers):
        boxes.append(Box("Add & Norm", "residual + norm", "norm", x, y))
        boxes.append(Box(label, concept, kind, x, y + BOX_HEIGHT + 8))
        y += 2 * (BOX_HEIGHT + 8) + 6
    return boxes


def figure() -> tuple[list[Box], list[tuple[str, int, int, int, int]]]:
    """Figure 1's boxes and the stacks' frames (label, x, top, width, height)."""
    attention = ("Multi-Head Attention", "multi-head attention", "attention")
    masked = ("Masked Multi-Head Attention", "multi-head attention", "attention")
    cross = ("Multi-Head Attention (cross)", "cross-attention", "attention")
    feed_forward = ("Feed Forward", "position-wise feed-forward", "feed-forward")
    encoder = layer_boxes(ENCODER_X, 258, [attention, feed_forward])
    decoder = layer_boxes(DECODER_X, 148, [masked, cross, feed_forward])
    boxes = [
        Box("Linear + Softmax (generator)", "generator", "generator", DECODER_X, 20),
        Box("Final LayerNorm", "encoder and decoder stacks", "norm", DECODER_X, 84),
        *decoder,
        Box("Positional Encoding", "positional encoding", "position", DECODER_X, 516),
        Box("Output Embedding × √d_model", "token embedding", "embedding", DECODER_X, 576),
        Box("Final LayerNorm", "encoder and decoder stacks", "norm", ENCODER_X, 194),
        *encoder,
        Box("Positional Encoding", "positional encoding", "position", ENCODER_X, 516),
        Box("Input Embedding × √d_model", "token embedding", "embedding", ENCODER_X, 576),
    ]
    frames = [(label, x - 14, min(box.y for box in layer) - 8, BOX_WIDTH + 28,
               max(box.y for box in layer) - min(box.y for box in layer) + BOX_HEIGHT + 16)
              for label, x, layer in (("encoder layer", ENCODER_X, encoder),
                                      ("decoder layer", DECODER_X, decoder))]
    return boxes, frames


def row_for(box_concept: str, rows: list[Concept]) -> Concept:
    found = [row for row in rows if plain(row.title).startswith(box_concept)]
    if not found:
        raise ValueError(f"the concept map has no row starting {box_concept!r} (the picture draws it)")
    return found[0]


def links(row: Concept) -> list[tuple[str, str]]:
    """(style, href) for each teaching style: the line of the first symbol its cell names."""
    found = []
    for cell in row.cells:
        if cell.column in STYLES and cell.symbols:
            symbol = cell.symbols[0]
            found.append((cell.column, f"{TO_ROOT}{symbol.path}#L{symbol.line}"))
    return found


def box_svg(box: Box, row: Concept) -> str:
    x, y, middle = box.x, box.y, box.x + BOX_WIDTH // 2
    parts = [f'<g class="box" data-concept="{html.escape(plain(row.title))}">',
             f'<rect x="{x}" y="{y}" width="{BOX_WIDTH}" height="{BOX_HEIGHT}" rx="6" '
             f'fill="{FILL[box.kind]}" stroke="#444"/>',
             f'<text x="{middle}" y="{y + 18}" class="label">{html.escape(box.label)}</text>']
    anchors = links(row)
    step = BOX_WIDTH // (len(anchors) + 1)
    for k, (style, href) in enumerate(anchors, start=1):
        parts.append(f'<a href="{html.escape(href)}"><text x="{x + k * step}" y="{y + 35}" '
                     f'class="link">{style}</text></a>')
    parts.append("</g>")
    return "".join(parts)


def arrow(x: int, y_from: int, y_to: int) -> str:
    return f'<line x1="{x}" y1="{y_from}" x2="{x}" y2="{y_to}" class="flow" marker-end="url(#head)"/>'


def render(rows: list[Concept]) -> str:
    boxes, frames = figure()
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
             f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif">',
             "<title>The encoder-decoder Transformer (Figure 1 of the paper), linked to the code"
             "</title>",
             "<style>.label{font-size:13px;text-anchor:middle}"
             ".link{font-size:11px;text-anchor:middle;fill:#0969da;text-decoration:underline}"
             ".frame{fill:#f6f8fa;stroke:#888;stroke-dasharray:4 3}"
             ".flow{stroke:#444;stroke-width:1.5}.side{font-size:13px}</style>",
             '<defs><marker id="head" markerWidth="8" markerHeight="8" refX="6" refY="4" '
             'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#444"/></marker></defs>']
    for label, x, top, width, height in frames:
        row = row_for(label, rows)
        anchors = " · ".join(f'<a href="{html.escape(href)}"><tspan class="link">{style}</tspan></a>'
                             for style, href in links(row))
        parts.append(f'<g class="frame-group" data-concept="{html.escape(plain(row.title))}">'
                     f'<rect x="{x}" y="{top}" width="{width}" height="{height}" rx="10" class="frame"/>'
                     f'<text x="{x + 4}" y="{top + height + 16}" class="side">N × {label}: {anchors}</text>'
                     "</g>")
    for column_x in (ENCODER_X, DECODER_X):
        column = sorted((box for box in boxes if box.x == column_x), key=lambda box: box.y)
        for upper, lower in itertools.pairwise(column):
            parts.append(arrow(column_x + BOX_WIDTH // 2, lower.y, upper.y + BOX_HEIGHT))
    # the encoder's output feeds every decoder layer's cross-attention
    cross = next(box for box in boxes if box.concept == "cross-attention")
    memory = next(box for box in boxes if box.x == ENCODER_X and box.concept == "encoder and decoder stacks")
    parts.append(f'<polyline points="{ENCODER_X + BOX_WIDTH},{memory.y + BOX_HEIGHT // 2} '
                 f'{(ENCODER_X + BOX_WIDTH + DECODER_X) // 2},{memory.y + BOX_HEIGHT // 2} '
                 f'{(ENCODER_X + BOX_WIDTH + DECODER_X) // 2},{cross.y + BOX_HEIGHT // 2} '
                 f'{DECODER_X},{cross.y + BOX_HEIGHT // 2}" fill="none" class="flow" '
                 'marker-end="url(#head)"/>')
    parts += [box_svg(box, row_for(box.concept, rows)) for box in boxes]
    for column_x in (ENCODER_X, DECODER_X):
        parts.append(arrow(column_x + BOX_WIDTH // 2, HEIGHT - 32, 576 + BOX_HEIGHT))
    parts.append(f'<text x="{ENCODER_X + BOX_WIDTH // 2}" y="{HEIGHT - 14}" class="label">source ids</text>')
    parts.append(f'<text x="{DECODER_X + BOX_WIDTH // 2}" y="{HEIGHT - 14}" class="label">'
                 "target ids (shifted right)</text>")
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def picture(root: Path = ROOT) -> str:
    """What the command writes, from the concept map and the source under ``root``."""
    return render(concepts(root))


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog=COMMAND, description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    try:
        text = picture(ROOT)
        (ROOT / PICTURE).write_text(text, encoding="utf-8")
    except (ValueError, SyntaxError, OSError) as error:
        print(f"{COMMAND}: {first_line(error)}", file=sys.stderr)
        return 1
    print(f"wrote {PICTURE} ({len(text.encode()):,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Measure what each thing the converter gets right does to a checkpoint trained elsewhere, one at
a time: the rows' defaults (a final LayerNorm, ReLU, the paper's positions, a BOS start) against
Hugging Face's Marian and FSMT, and Hugging Face's own pitfalls.

    python -m scripts.checkpoint_deviations          # Markdown table on stdout
    python -m scripts.checkpoint_deviations --rows   # each tiny checkpoint in each row, no deviation

Each row builds a tiny checkpoint of ``seq2seq.hub.tiny`` (marian-swish-tied, fsmt-untied),
converts it, plants one deviation into the converted model (explicit, float64, eval) or into
Hugging Face's, and reports the largest |Δ log-prob| against Hugging Face's float64 forward
(its sinusoid tables recomputed in float64) over the real target positions of one batch:
tiny.SENTENCES as Hugging Face's tokenizer encodes them, right-padded, and seven seeded target
ids after the start id, one row right-padded. "none" is the converted model as it is. With
``--rows``, every tiny checkpoint (tiny.NAMES) converted, without deviation, in each row. Needs
the ``hf`` extra.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

from common.cli import Parser, first_line
from common.masks import causal_mask, decoder_mask, padding_mask
from seq2seq.hub import tiny
from seq2seq.hub.from_hf import convert
from seq2seq.hub.tokenizers import tokenizer_from_record
from seq2seq.storage.model_file import ModelFile, build_model
from variants import VARIANTS

# the deviations each family is measured under, in the table's order
DEVIATIONS = {
    "marian-swish-tied": ("none", "final LayerNorm after each stack (an identity one)",
                          "ReLU in place of swish", "the paper's interleaved positions",
                          "positions one row on",
                          "the start (padding) id masked as a key", "Hugging Face's float32 sinusoids"),
    "fsmt-untied": ("none", "final LayerNorm after each stack (an identity one)", "the paper's positions",
                    "positions one row on", "BOS in place of the EOS start",
                    "Hugging Face with use_cache=True (no causal mask)", "Hugging Face's float32 sinusoids"),
}


def batch(checkpoint: Path, record: ModelFile) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, S) source ids, (B, S) attention mask, (B, T) target ids (start id first, row 1 padded)."""
    encoded = tiny.hf_library().AutoTokenizer.from_pretrained(checkpoint)(
        list(tiny.SENTENCES), padding=True, return_tensors="pt")
    config = record.config
    tgt = torch.randint(0, config.tgt_vocab_size - 1, (len(tiny.SENTENCES), 7),
                        generator=torch.Generator().manual_seed(0))
    tgt = torch.where(tgt >= config.pad_id, tgt + 1, tgt)  # every id but padding
    tgt[:, 0] = tokenizer_from_record(record.tokenizer).start_id
    tgt[1, 4:] = config.pad_id
    return encoded["input_ids"], encoded["attention_mask"], tgt


def difference(checkpoint: Path, record: ModelFile, deviation: str, variant: str = "explicit") -> float:
    """max |Δ log-prob| of the converted model in ``variant`` with ``deviation`` against Hugging Face's."""
    config, weights = record.config, dict(record.weights)
    hf = tiny.hf_float64(checkpoint)
    if deviation.startswith("Hugging Face's float32"):  # its own tables, as from_pretrained builds them
        hf = type(hf).from_pretrained(checkpoint, attn_implementation="eager").double().eval()
    if deviation.startswith("final LayerNorm"):
        config = config.replace(final_norm=True)
        for stack in ("encoder", "decoder"):
            weights[f"{stack}.norm.weight"] = torch.ones(config.d_model)
            weights[f"{stack}.norm.bias"] = torch.zeros(config.d_model)
    elif deviation.startswith("ReLU"):
        config = config.replace(activation="relu")
    elif deviation.startswith("the paper's"):
        config = config.replace(positions="paper")
    elif deviation.startswith("positions one row on"):  # Hugging Face's tables read one row further
        with torch.no_grad():
            for stack in (hf.model.encoder, hf.model.decoder):
                stack.embed_positions.weight[:-1] = stack.embed_positions.weight[1:].clone()
    model = build_model(ModelFile(record.variant, config, record.settings, weights), variant).double().eval()
    src, attention, tgt = batch(checkpoint, record)
    ours_tgt = tgt.clone()
    if deviation.startswith("BOS in place"):
        ours_tgt[:, 0] = 0  # fairseq's <s>
    tgt_mask = decoder_mask(ours_tgt, config.pad_id)
    if deviation.startswith("the start (padding) id"):
        tgt_mask = padding_mask(ours_tgt, config.pad_id) & causal_mask(tgt.shape[1])
    with torch.no_grad(), tiny.fsmt_float64_masks():
        ours = model(src, ours_tgt, padding_mask(src, config.pad_id), tgt_mask)
        logits = hf(input_ids=src, attention_mask=attention, decoder_input_ids=tgt,
                    use_cache=deviation.endswith("(no causal mask)")).logits
    theirs = torch.log_softmax(logits, dim=-1)  # every column: a ban is a decoding setting, not the forward's
    real = tgt != config.pad_id
    real[:, 0] = True
    return (ours - theirs)[real].abs().max().item()


def table() -> str:
    lines = ["| checkpoint | deviation | max \\|Δ log-prob\\| |", "|---|---|---|"]
    with tempfile.TemporaryDirectory() as folder:
        for name, deviations in DEVIATIONS.items():
            checkpoint = tiny.build(name, Path(folder) / name)
            record = convert(checkpoint)
            lines += [f"| {name} | {deviation} | {difference(checkpoint, record, deviation):.2g} |"
                      for deviation in deviations]
    return "\n".join(lines)


def rows_table() -> str:
    lines = [f"| checkpoint | {' | '.join(VARIANTS)} |", f"|---|{'---|' * len(VARIANTS)}"]
    with tempfile.TemporaryDirectory() as folder:
        for name in tiny.NAMES:
            checkpoint = tiny.build(name, Path(folder) / name)
            record = convert(checkpoint)
            cells = (f"{difference(checkpoint, record, 'none', variant):.1e}" for variant in VARIANTS)
            lines.append(f"| {name} | {' | '.join(cells)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = Parser(prog="python -m scripts.checkpoint_deviations", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", action="store_true", help="each tiny checkpoint in each row, no deviation")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    try:
        print(rows_table() if args.rows else table())
    except ImportError as error:  # the hf extra missing
        sys.exit(f"python -m scripts.checkpoint_deviations: error: {first_line(error)}")


if __name__ == "__main__":
    main()

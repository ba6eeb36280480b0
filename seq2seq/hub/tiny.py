"""Tiny Hugging Face checkpoints of both families, built and saved without a network: random
models from configs shaped like the real ones, scaled down (d_model 16, 2 + 2 layers, 4 heads),
every tensor moved off its initial value, saved with ``save_pretrained`` beside a tokenizer
trained here on a dozen sentences. The converter's proofs run on them (tests/seq2seq/hub/), and
so does ``python -m scripts.checkpoint_deviations``.

    build("marian-swish-tied", Path("tiny/marian"))       # a folder from_pretrained reads
    model = hf_float64(Path("tiny/marian"))              # Hugging Face's own model, in float64

    marian-swish-tied   opus-mt base: swish, one shared vocabulary, tied embeddings and generator
    marian-relu-two     opus-mt-tc-big-like: relu, separate source and target vocabularies
    fsmt-tied           allenai/wmt19-*-6-6-base-like: one vocabulary, tied
    fsmt-untied         facebook/wmt19-like: source and target vocabularies of different sizes,
                        an encoder FFN wider than the decoder's

Each generator favours EOS a little (``EOS_BIAS``), so that greedy translations end at
different steps, some at the length limit. The Marian models forbid their padding id at
generation, as opus-mt's generation settings do (``bad_words_ids``). Needs the ``hf`` extra
(transformers, sacremoses) and sentencepiece.

``hf_float64`` meets two of Hugging Face's pitfalls: both families build their sinusoid tables
in float32, even in a float64 model (recomputed here in float64, each from its family's own
formula), and FSMT fills its causal mask with the float64 minimum through a float32 tensor,
which overflows (``fsmt_float64_masks`` fills it in the mask's own dtype while entered).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import math
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import torch

from seq2seq.hub.from_hf import hf_library
from seq2seq.hub.tokenizers import sacremoses_module, sentencepiece_module

SOURCE_SENTENCES = (
    "The cat sees the house.", "The dog likes the tree.", "My father follows a car.",
    "The girl hears the river.", "Our teacher sees my brother.", "A bird likes the garden.",
    "The cat hears a song.", "The dog follows the city.", "My father likes the sea.",
    "The girl sees a book.", "Where is the station?", "I'm hungry.", "Thank you!",
)
TARGET_SENTENCES = (
    "Die Katze sieht das Haus.", "Der Hund mag den Baum.", "Mein Vater folgt einem Auto.",
    "Das Mädchen hört den Fluss.", "Unser Lehrer sieht meinen Bruder.", "Ein Vogel mag den Garten.",
    "Die Katze hört ein Lied.", "Der Hund folgt der Stadt.", "Mein Vater mag das Meer.",
    "Das Mädchen sieht ein Buch.", "Wo ist der Bahnhof?", "Ich habe Hunger.", "Danke schön!",
)
# what the proofs translate: seen words, unseen ones (unknown pieces), a language code, a long one
SENTENCES = ("The cat sees the house.", "Where is the dog?", ">>de<< My father likes the sea.",
             "Zebras quote xylophones!", "The girl hears a song and the dog follows the bird.")
# added to EOS's logit: chosen per model so that greedy rows of SENTENCES end at mixed steps
EOS_BIAS = {"marian-swish-tied": 3.0, "marian-relu-two": 1.5, "fsmt-tied": 1.5, "fsmt-untied": 2.5}
SPREAD = {True: 0.2, False: 0.05}  # of the moves of gains (True) and biases; a matrix's: 1/sqrt(fan_in)
NAMES = tuple(EOS_BIAS)


# --- tokenizers ----------------------------------------------------------------------------


def train_spm(sentences: Iterable[str], size: int) -> bytes:
    """A sentencepiece model of about ``size`` pieces trained on ``sentences`` (opus-mt's are
    unigram models with the default nmt_nfkc normalisation)."""
    model = io.BytesIO()
    sentencepiece_module().SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=model, vocab_size=size, model_type="unigram",
        character_coverage=1.0, num_threads=1, minloglevel=2, hard_vocab_limit=False)
    return model.getvalue()


def _spm_pieces(proto: bytes) -> list[str]:
    processor = sentencepiece_module().SentencePieceProcessor()
    processor.LoadFromSerializedProto(proto)
    return [processor.id_to_piece(i) for i in range(processor.get_piece_size())
            if not (processor.is_control(i) or processor.is_unknown(i))]


def write_marian_tokenizer(folder: Path, separate: bool) -> tuple[int, int, int]:
    """source.spm, target.spm and vocab.json (and target_vocab.json when ``separate``), saved by
    ``MarianTokenizer``; returns (source size, target size, pad id). As in opus-mt, EOS is 0 and
    UNK 1; a shared vocabulary ends in <pad>, separate ones hold it at 2 in both."""
    protos = {"source": train_spm(SOURCE_SENTENCES, 60), "target": train_spm(TARGET_SENTENCES, 60)}
    for side, proto in protos.items():
        (folder / f"{side}.spm").write_bytes(proto)

    def vocabulary(pieces: list[str], pad_last: bool) -> dict[str, int]:
        ordered = ["</s>", "<unk>", *([] if pad_last else ["<pad>"]), ">>de<<",
                   *dict.fromkeys(p for p in pieces if p not in ("</s>", "<unk>", "<pad>", ">>de<<")),
                   *(["<pad>"] if pad_last else [])]
        return {piece: i for i, piece in enumerate(ordered)}

    source_pieces, target_pieces = _spm_pieces(protos["source"]), _spm_pieces(protos["target"])
    if separate:
        source, target = vocabulary(source_pieces, False), vocabulary(target_pieces, False)
    else:
        source = target = vocabulary(source_pieces + target_pieces, True)
    files = {"source_spm": folder / "source.spm", "target_spm": folder / "target.spm",
             "vocab": folder / "vocab.json"}
    files["vocab"].write_text(json.dumps(source, ensure_ascii=False), encoding="utf-8")
    if separate:
        files["target_vocab_file"] = folder / "target_vocab.json"
        files["target_vocab_file"].write_text(json.dumps(target, ensure_ascii=False), encoding="utf-8")
    hf_library().MarianTokenizer(**{key: str(path) for key, path in files.items()}, separate_vocabs=separate,
                                 source_lang="en", target_lang="de").save_pretrained(folder)
    return len(source), len(target), source["<pad>"]


def learn_bpe(words: Counter, merges: int) -> list[tuple[str, str]]:
    """subword-nmt's learner on word counts: the most frequent adjacent pair (the first seen of
    equals) is merged everywhere, ``merges`` times; a word's last symbol ends in ``</w>``."""
    segmented = {word: [*word[:-1], word[-1] + "</w>"] for word in words}
    learned: list[tuple[str, str]] = []
    for _ in range(merges):
        pairs: Counter = Counter()
        for word, symbols in segmented.items():
            for pair in itertools.pairwise(symbols):
                pairs[pair] += words[word]
        if not pairs:
            break
        best = max(pairs, key=pairs.__getitem__)
        learned.append(best)
        for word, symbols in segmented.items():
            merged, i = [], 0
            while i < len(symbols):
                if tuple(symbols[i:i + 2]) == best:
                    merged.append(symbols[i] + symbols[i + 1])
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            segmented[word] = merged
    return learned


def write_fsmt_tokenizer(folder: Path, joint: bool) -> tuple[int, int]:
    """merges.txt, vocab-src.json and vocab-tgt.json, saved by ``FSMTTokenizer`` (ids 0-3 are <s>,
    <pad>, </s>, <unk>, as in fairseq's dictionaries): joint merges learnt on the Moses tokens of
    both languages; one vocabulary (``joint``), or each language's own."""
    moses = sacremoses_module()
    tokens = {"en": Counter(), "de": Counter()}
    for language, sentences in (("en", SOURCE_SENTENCES), ("de", TARGET_SENTENCES)):
        tokenizer = moses.MosesTokenizer(lang=language)
        for sentence in sentences:
            tokens[language].update(tokenizer.tokenize(sentence, aggressive_dash_splits=True, escape=True))
    merges = learn_bpe(tokens["en"] + tokens["de"], 40)
    (folder / "merges.txt").write_text("".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8")

    def vocabulary(counts: Counter) -> dict[str, int]:
        symbols = {symbol for word in counts for symbol in (*word[:-1], word[-1] + "</w>", word[-1])}
        symbols |= {a + b for a, b in merges}
        return {piece: i for i, piece in enumerate(["<s>", "<pad>", "</s>", "<unk>", *sorted(symbols)])}

    source, target = ((vocabulary(tokens["en"] + tokens["de"]),) * 2 if joint
                      else (vocabulary(tokens["en"]), vocabulary(tokens["de"])))
    for name, table in (("vocab-src.json", source), ("vocab-tgt.json", target)):
        (folder / name).write_text(json.dumps(table, ensure_ascii=False), encoding="utf-8")
    hf_library().FSMTTokenizer(langs=["en", "de"], src_vocab_file=str(folder / "vocab-src.json"),
                               tgt_vocab_file=str(folder / "vocab-tgt.json"),
                               merges_file=str(folder / "merges.txt")).save_pretrained(folder)
    return len(source), len(target)


# --- models --------------------------------------------------------------------------------


def move_off_initial_values(model: torch.nn.Module, seed: int) -> None:
    """Every floating parameter and buffer but the sinusoid tables moved by a seeded random
    amount: a matrix's entries by N(0, 1/fan_in), gains by N(0, 0.2²), biases (the padding rows
    and Marian's final_logits_bias included) by N(0, 0.05²)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in {**dict(model.named_parameters()), **dict(model.named_buffers())}.items():
            if "embed_positions" in name or not tensor.is_floating_point():
                continue
            noise = torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype)
            spread = 1 / math.sqrt(tensor.shape[-1]) if tensor.ndim == 2 else SPREAD[name.endswith("weight")]
            tensor.add_(noise * spread)


def build_marian(folder: Path, name: str, activation: str, separate: bool, seed: int) -> None:
    source_size, target_size, pad = write_marian_tokenizer(folder, separate)
    transformers = hf_library()
    config = transformers.MarianConfig(
        vocab_size=source_size, decoder_vocab_size=target_size, d_model=16, encoder_layers=2,
        decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=32,
        decoder_ffn_dim=32, activation_function=activation, max_position_embeddings=64,
        scale_embedding=True, pad_token_id=pad, eos_token_id=0, decoder_start_token_id=pad,
        forced_eos_token_id=0, share_encoder_decoder_embeddings=not separate, tie_word_embeddings=True,
        dropout=0.1)
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(config)
    move_off_initial_values(model, seed)
    with torch.no_grad():
        model.final_logits_bias[0, config.eos_token_id] += EOS_BIAS[name]
    # opus-mt's generation settings: the padding id is never generated; beam 4
    model.generation_config.update(bad_words_ids=[[pad]], num_beams=4, max_length=64)
    model.save_pretrained(folder)


def build_fsmt(folder: Path, name: str, tied: bool, seed: int) -> None:
    source_size, target_size = write_fsmt_tokenizer(folder, joint=tied)
    transformers = hf_library()
    config = transformers.FSMTConfig(
        langs=["en", "de"], src_vocab_size=source_size, tgt_vocab_size=target_size, d_model=16,
        encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=32 if tied else 48, decoder_ffn_dim=32, activation_function="relu",
        max_position_embeddings=64, scale_embedding=True, tie_word_embeddings=tied, dropout=0.1,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=2)
    torch.manual_seed(seed)
    model = transformers.FSMTForConditionalGeneration(config)
    move_off_initial_values(model, seed)
    with torch.no_grad():  # fairseq's generator has no bias: EOS's row leans towards the last norm's shift
        shift = model.model.decoder.layers[-1].final_layer_norm.bias
        lean = EOS_BIAS[name] * shift / shift.norm() ** 2
        model.model.decoder.output_projection.weight[config.eos_token_id] += lean
    model.generation_config.update(num_beams=4, max_length=64)
    model.save_pretrained(folder)


def build(name: str, folder: Path) -> Path:
    """Build and save the tiny checkpoint ``name`` (one of ``NAMES``) into ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if name == "marian-swish-tied":
        build_marian(folder, name, "swish", separate=False, seed=1)
    elif name == "marian-relu-two":
        build_marian(folder, name, "relu", separate=True, seed=2)
    elif name in ("fsmt-tied", "fsmt-untied"):
        build_fsmt(folder, name, tied=name == "fsmt-tied", seed={"fsmt-tied": 3, "fsmt-untied": 4}[name])
    else:
        raise ValueError(f"no tiny checkpoint {name!r}; there are {', '.join(NAMES)}")
    return folder


# --- Hugging Face's model in float64 --------------------------------------------------------


def marian_sinusoids(rows: int, d: int) -> torch.Tensor:
    """Marian's table as Hugging Face writes it (``MarianSinusoidalPositionalEmbedding``), in
    float64 throughout: [sin | cos] of pos / 10000^(2 (j // 2) / d)."""
    angle = np.array([[pos / np.power(10000, 2 * (j // 2) / d) for j in range(d)] for pos in range(rows)])
    return torch.from_numpy(np.concatenate([np.sin(angle[:, 0::2]), np.cos(angle[:, 1::2])], axis=1))


def fairseq_sinusoids(rows: int, d: int, pad: int) -> torch.Tensor:
    """fairseq's table as Hugging Face writes it (``SinusoidalPositionalEmbedding.get_embedding``),
    in float64: row q is [sin(q w) | cos(q w)], w_k = exp(-k log(10000) / (d/2 - 1)); row ``pad`` zero."""
    half = d // 2
    frequency = torch.exp(torch.arange(half, dtype=torch.float64) * -(math.log(10000) / (half - 1)))
    angle = torch.arange(rows, dtype=torch.float64)[:, None] * frequency[None, :]
    table = torch.cat([torch.sin(angle), torch.cos(angle)], dim=1)
    table[pad] = 0
    return table


def hf_float64(folder: Path) -> torch.nn.Module:
    """The checkpoint in Hugging Face's own class, float64, eval mode, eager attention, its
    sinusoid tables recomputed in float64 (Hugging Face builds them in float32)."""
    transformers = hf_library()
    kind = transformers.AutoConfig.from_pretrained(folder).model_type
    cls = transformers.MarianMTModel if kind == "marian" else transformers.FSMTForConditionalGeneration
    model = cls.from_pretrained(folder, attn_implementation="eager").double().eval()
    with torch.no_grad():
        for stack in (model.model.encoder, model.model.decoder):
            table = stack.embed_positions.weight
            rows, d = table.shape
            table.copy_(marian_sinusoids(rows, d) if kind == "marian"
                        else fairseq_sinusoids(rows, d, model.config.pad_token_id))
    return model


@contextlib.contextmanager
def fsmt_float64_masks() -> Iterator[None]:
    """Inside: FSMT's causal mask is filled with the minimum of its own dtype. Its
    ``fill_with_neg_inf`` fills a float32 copy with the float64 minimum, which overflows."""
    from transformers.models.fsmt import modeling_fsmt

    original = modeling_fsmt.fill_with_neg_inf
    modeling_fsmt.fill_with_neg_inf = lambda tensor: tensor.fill_(torch.finfo(tensor.dtype).min)
    try:
        yield
    finally:
        modeling_fsmt.fill_with_neg_inf = original

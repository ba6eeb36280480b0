"""A converted checkpoint computes Hugging Face's function, in every row: log-probabilities in
float64 within 1e-9, greedy tokens and beam hypotheses identical to ``generate``'s, and the
translate command's text identical to Hugging Face's own tokenizer + ``generate`` + decode.

The expected values are Hugging Face's own (``MarianMTModel``, ``FSMTForConditionalGeneration``
on the tiny checkpoints of ``seq2seq.hub.tiny``), with its float32 sinusoid tables recomputed in
float64 (``tiny.hf_float64``: otherwise the positions alone differ by about 6e-8), FSMT called
with ``use_cache=False`` (with the cache it applies no causal mask to a multi-token forward) and
its causal mask filled in float64 (``tiny.fsmt_float64_masks``). The forward is compared in
every column: ids the checkpoint's generation settings forbid (Marian's padding id) are a
decoding setting of the model file (``ModelFile.banned_ids``), which the searches apply as
``generate`` does, not part of the weights.
"""

from __future__ import annotations

import pytest
import torch

from common.masks import decoder_mask, padding_mask
from seq2seq import translate
from seq2seq.hub import tiny
from seq2seq.hub.tokenizers import tokenizer_from_record
from seq2seq.search.beam import beam_search, length_penalty
from seq2seq.search.greedy import greedy_decode
from seq2seq.storage.model_file import build_model, save

TOLERANCE = 1e-9  # max |Δ log-prob| in float64
MAX_LEN = 20  # the searches' length limit, the start id included


def hf_tokenizer(checkpoint):
    return tiny.hf_library().AutoTokenizer.from_pretrained(checkpoint.folder)


def sources(checkpoint) -> tuple[torch.Tensor, torch.Tensor]:
    """tiny.SENTENCES as Hugging Face's tokenizer encodes them, right-padded: (B, S) ids, (B, S) mask."""
    batch = hf_tokenizer(checkpoint)(list(tiny.SENTENCES), padding=True, return_tensors="pt")
    return batch["input_ids"], batch["attention_mask"]


def targets(checkpoint, length: int = 7) -> torch.Tensor:
    """(B, T) random target ids after the start id, never padding; row 1 right-padded after 4."""
    config = checkpoint.record.config
    start = tokenizer_from_record(checkpoint.record.tokenizer).start_id
    ids = torch.randint(0, config.tgt_vocab_size - 1, (len(tiny.SENTENCES), length),
                        generator=torch.Generator().manual_seed(0))
    ids = torch.where(ids >= config.pad_id, ids + 1, ids)  # every id but padding
    ids[:, 0] = start
    ids[1, 4:] = config.pad_id
    return ids


def hf_log_probs(model, src, attention, tgt) -> torch.Tensor:
    """Hugging Face's forward as log-probabilities in float64, every column as it is."""
    with tiny.fsmt_float64_masks(), torch.no_grad():
        logits = model(input_ids=src, attention_mask=attention, decoder_input_ids=tgt, use_cache=False).logits
    return torch.log_softmax(logits, dim=-1)


def real_positions(tgt: torch.Tensor, pad_id: int) -> torch.Tensor:
    """(B, T) True at the start id and every non-padding target position."""
    real = tgt != pad_id
    real[:, 0] = True
    return real


def compare(ours: torch.Tensor, theirs: torch.Tensor, real: torch.Tensor) -> float:
    """max |Δ| over real target positions, in every column (the forbidden ids' included)."""
    return (ours - theirs)[real].abs().max().item()


@pytest.fixture(scope="module")
def hf_models():
    return {}


def hf_model(checkpoint, cache):
    if checkpoint.name not in cache:
        cache[checkpoint.name] = tiny.hf_float64(checkpoint.folder)
    return cache[checkpoint.name]


def test_log_probs_match_hugging_face_in_float64(checkpoint, variant, hf_models):
    config = checkpoint.record.config
    src, attention = sources(checkpoint)
    tgt = targets(checkpoint)
    expected = hf_log_probs(hf_model(checkpoint, hf_models), src, attention, tgt)
    model = build_model(checkpoint.record, variant).double().eval()
    with torch.no_grad():
        got = model(src, tgt, padding_mask(src, config.pad_id), decoder_mask(tgt, config.pad_id))
    assert compare(got, expected, real_positions(tgt, config.pad_id)) <= TOLERANCE


def test_greedy_tokens_match_generate(checkpoint, variant, hf_models):
    """Every row's tokens, the padding after EOS included; Hugging Face's forced EOS at the length
    limit is switched off (the searches here have none: docs/real-checkpoints.md)."""
    config = checkpoint.record.config
    tokenizer = tokenizer_from_record(checkpoint.record.tokenizer)
    src, attention = sources(checkpoint)
    expected = hf_model(checkpoint, hf_models).generate(
        input_ids=src, attention_mask=attention, num_beams=1, do_sample=False, max_length=MAX_LEN,
        forced_eos_token_id=None)
    model = build_model(checkpoint.record, variant).double().eval()
    got = greedy_decode(model, src, padding_mask(src, config.pad_id), max_len=MAX_LEN,
                        bos_id=tokenizer.start_id, eos_id=tokenizer.eos_id,
                        banned_ids=checkpoint.record.banned_ids)
    assert torch.equal(got, expected)
    ended = (got[:, 1:] == tokenizer.eos_id).any(dim=1)  # (an FSMT row starts with EOS)
    assert ended.any() and not ended.all()  # rows that end before the limit, and rows that run to it


def generated(row: torch.Tensor, pad_id: int) -> list[int]:
    """A hypothesis's generated ids: after the start id, up to and with EOS, without padding."""
    return [i for i in row.tolist()[1:] if i != pad_id]


def test_beam_hypotheses_match_generate_without_length_penalty(checkpoint, hf_models):
    """alpha 0 here is Hugging Face's length_penalty 0: both rank hypotheses by log-probability."""
    config = checkpoint.record.config
    tokenizer = tokenizer_from_record(checkpoint.record.tokenizer)
    src, attention = sources(checkpoint)
    expected = hf_model(checkpoint, hf_models).generate(
        input_ids=src, attention_mask=attention, num_beams=4, do_sample=False, max_length=MAX_LEN,
        length_penalty=0.0, forced_eos_token_id=None)
    model = build_model(checkpoint.record, "explicit").double().eval()
    got = beam_search(model, src, padding_mask(src, config.pad_id), bos_id=tokenizer.start_id,
                      eos_id=tokenizer.eos_id, beam_size=4, alpha=0.0, max_len=MAX_LEN,
                      banned_ids=checkpoint.record.banned_ids).tokens
    for ours, theirs in zip(got, expected, strict=True):
        assert generated(ours, config.pad_id) == generated(theirs, config.pad_id)


def test_beam_scores_are_hugging_face_log_probabilities_over_the_length_penalty(checkpoint, hf_models):
    """At alpha 0.6 the length penalties differ (here ((5 + |Y|) / 6)^alpha, Hugging Face's
    |Y|^length_penalty), so the hypotheses may too: each of ours is scored against Hugging Face's
    teacher-forced log-probability of its tokens."""
    config = checkpoint.record.config
    tokenizer = tokenizer_from_record(checkpoint.record.tokenizer)
    src, attention = sources(checkpoint)
    model = build_model(checkpoint.record, "explicit").double().eval()
    best = beam_search(model, src, padding_mask(src, config.pad_id), bos_id=tokenizer.start_id,
                       eos_id=tokenizer.eos_id, beam_size=4, alpha=0.6, max_len=MAX_LEN,
                       banned_ids=checkpoint.record.banned_ids)
    tgt = best.tokens  # (B, L): start, generated ids, padding after EOS
    log_probs = hf_log_probs(hf_model(checkpoint, hf_models), src, attention, tgt[:, :-1])
    picked = log_probs.gather(-1, tgt[:, 1:, None])[..., 0]  # (B, L - 1)
    ends = (tgt[:, :-1] == tokenizer.eos_id) & (torch.arange(tgt.shape[1] - 1) > 0)  # (an FSMT start is EOS)
    after_eos = torch.cumsum(ends, dim=1) > 0  # (B, L - 1): inputs at or after the generated EOS
    length = (~after_eos).sum(dim=1)  # generated ids, EOS included
    expected = picked.masked_fill(after_eos, 0).sum(dim=1) / length_penalty(length.double(), 0.6)
    torch.testing.assert_close(best.scores, expected, atol=TOLERANCE, rtol=0)


def translate_lines(path, sentences, capsys, *options) -> list[str]:
    capsys.readouterr()
    translate.main([str(path), *sentences, *options])
    return capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("beam", [1, 4])
def test_translate_command_matches_hugging_face(checkpoint, beam, tmp_path, capsys):
    """python -m seq2seq.translate on the converted file prints what Hugging Face's own
    tokenizer, generate and decode give on the checkpoint (float32 both, Hugging Face's own
    float32 positions), at the same length limit, within the model's positions (max_seq_len):
    greedy, the batch's longest source + 50 generated ids; beam search, each source's own
    length + 50 (Hugging Face's one limit per call: one sentence per call)."""
    path = save(checkpoint.record, tmp_path / "model.pt")
    got = translate_lines(path, tiny.SENTENCES, capsys, "--beam", str(beam), "--alpha", "0")
    tokenizer = hf_tokenizer(checkpoint)
    model = tiny.hf_library().AutoModelForSeq2SeqLM.from_pretrained(checkpoint.folder).eval()
    expected = []
    for sentences in [tiny.SENTENCES] if beam == 1 else [[sentence] for sentence in tiny.SENTENCES]:
        batch = tokenizer(list(sentences), padding=True, return_tensors="pt")
        limit = min(batch["input_ids"].shape[1] + 51, checkpoint.record.config.max_seq_len)
        output = model.generate(**batch, num_beams=beam, do_sample=False, length_penalty=0.0,
                                max_length=limit, forced_eos_token_id=None)
        expected += tokenizer.batch_decode(output, skip_special_tokens=True)
    assert got == expected


@pytest.mark.slow  # every family x every row: the rows' forwards are proved equal by default
def test_every_row_translates_alike(checkpoint, variant, tmp_path, capsys):
    path = save(checkpoint.record, tmp_path / "model.pt")
    expected = translate_lines(path, tiny.SENTENCES, capsys, "--beam", "2")
    assert translate_lines(path, tiny.SENTENCES, capsys, "--beam", "2", "--variant", variant) == expected


def test_the_tokenizer_is_hugging_face_s(checkpoint):
    """The source ids of tokenizer(texts) (without its EOS), and batch_decode(ids,
    skip_special_tokens=True) of target rows holding every kind of id."""
    ours = tokenizer_from_record(checkpoint.record.tokenizer)
    theirs = hf_tokenizer(checkpoint)
    texts = [*tiny.SENTENCES, "", "  Two  spaces, «quotes» – and a dash-split word."]
    assert ours.encode(texts) == [ids[:-1] for ids in theirs(texts)["input_ids"]]
    assert [ids[-1] for ids in theirs(texts)["input_ids"]] == [ours.eos_id] * len(texts)
    rows = torch.randint(0, ours.target_size, (20, 12), generator=torch.Generator().manual_seed(1)).tolist()
    assert ours.decode(rows) == theirs.batch_decode(rows, skip_special_tokens=True)
    assert (ours.pad_id, ours.start_id) == (checkpoint.record.config.pad_id,
                                           tiny.hf_library().AutoConfig.from_pretrained(checkpoint.folder)
                                           .decoder_start_token_id)

"""What a static decoder (``StaticGreedy``, ``StaticBeam``) checks, and when: its settings once,
when built (a bad one is refused there, before any call), and at each call only what the call
brings, the source and its mask; and the mode it decodes in: eval, whatever mode the model is
in, each module's mode given back afterwards (as ``greedy_decode`` and ``beam_search`` do).
Eager steps throughout (no compile)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from common.weights import import_weights
from seq2seq.data.ids import BOS_ID, EOS_ID, PAD_ID
from seq2seq.fast import static_search
from seq2seq.fast.static_search import StaticBeam, StaticGreedy
from variants import build

MAX_LEN = 10  # the copy model's max_seq_len
SETTINGS_CHECK = {"greedy": "check_arguments", "beam": "check_beam_arguments"}


def static_decoder(kind: str, model: nn.Module, **changes):
    """A static greedy decoder or beam search (beam 2) on ``model``, eager, with ``changes`` to its
    settings; called as ``decoder(src, src_mask)``, it gives the tokens."""
    settings = dict(max_len=MAX_LEN, bos_id=BOS_ID, eos_id=EOS_ID) | changes
    if kind == "greedy":
        return StaticGreedy(model, **settings)
    beam = StaticBeam(model, beam_size=2, **settings)
    return lambda src, src_mask: beam(src, src_mask).tokens


def with_dropout(copy_model) -> nn.Module:
    """fused holding the copy model's trained weights, with dropout 0.5, in train mode."""
    model = build("fused", copy_model.config.replace(dropout=0.5))
    import_weights(model, copy_model.weights)
    return model.train()


def modes(model: nn.Module) -> dict[str, bool]:
    return {name: module.training for name, module in model.named_modules()}


# --- the settings once, the source at each call -----------------------------------------------


@pytest.mark.parametrize("kind", ["greedy", "beam"])
def test_the_settings_are_checked_when_built_and_a_call_checks_only_its_source(copy_model, monkeypatch,
                                                                                kind):
    """Three calls run the settings' check not once more than the construction did; each call
    checks its own source and mask."""
    calls = {"settings": 0, "source": 0}

    def counted(what, check):
        def count(*args, **kwargs):
            calls[what] += 1
            return check(*args, **kwargs)
        return count

    name = SETTINGS_CHECK[kind]
    monkeypatch.setattr(static_search, name, counted("settings", getattr(static_search, name)))
    monkeypatch.setattr(static_search, "check_source", counted("source", static_search.check_source))
    decode = static_decoder(kind, copy_model.build("fused"))
    assert calls == {"settings": 1, "source": 0}
    for rows in (slice(0, 8), slice(8, 16), slice(0, 8)):
        decode(copy_model.src[rows], copy_model.src_mask[rows])
    assert calls == {"settings": 1, "source": 3}


@pytest.mark.parametrize("kind", ["greedy", "beam"])
@pytest.mark.parametrize(("changes", "error", "said"), [
    (dict(max_len=0), ValueError, rf"max_len must lie in \[1, max_seq_len={MAX_LEN}\]"),
    (dict(max_len=None), TypeError, "max_len must be an int"),
    (dict(eos_id=BOS_ID), ValueError, "bos_id and eos_id must differ"),
    (dict(eos_id=PAD_ID), ValueError, rf"eos_id must differ from config.pad_id \({PAD_ID}\)"),
    (dict(bos_id=1.0), TypeError, "bos_id must be an int"),
], ids=["max_len-0", "max_len-None", "bos-is-eos", "eos-is-pad", "bos-float"])
def test_a_bad_setting_is_refused_when_the_decoder_is_built(copy_model, kind, changes, error, said):
    with pytest.raises(error, match=said):
        static_decoder(kind, copy_model.build("fused"), **changes)


@pytest.mark.parametrize("kind", ["greedy", "beam"])
def test_a_call_refuses_a_bad_source_mask_and_a_padding_only_row(copy_model, kind):
    decode = static_decoder(kind, copy_model.build("fused"))
    src, src_mask = copy_model.src[:4], copy_model.src_mask[:4]
    with pytest.raises(ValueError, match="src_mask must mask source keys only"):
        decode(src, src_mask.expand(-1, -1, src.shape[1], -1))  # (B, 1, S, S): a query dimension
    padding_only = src.clone()
    padding_only[2] = PAD_ID
    with pytest.raises(ValueError, match="every position of source row 2"):
        decode(padding_only, padding_only[:, None, None, :] != PAD_ID)
    assert torch.equal(decode(src, src_mask), decode(src, src_mask))  # the decoder still decodes


# --- eval mode ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["greedy", "beam"])
def test_a_model_in_train_mode_decodes_as_in_eval_mode(copy_model, kind):
    """A decoder built on a model in train mode decodes without dropout: dropout 0.5 changes
    nothing, and the model is in train mode again afterwards."""
    model = with_dropout(copy_model)
    decode = static_decoder(kind, model)
    model.eval()
    expected = decode(copy_model.src, copy_model.src_mask)
    model.train()
    torch.manual_seed(0)
    assert torch.equal(decode(copy_model.src, copy_model.src_mask), expected)
    assert all(module.training for module in model.modules())


@pytest.mark.parametrize("kind", ["greedy", "beam"])
def test_each_modules_mode_comes_back_even_after_an_error(copy_model, kind):
    model = with_dropout(copy_model)
    model.encoder.eval()  # the caller's mix: a frozen encoder
    before = modes(model)
    decode = static_decoder(kind, model)
    decode(copy_model.src, copy_model.src_mask)
    assert modes(model) == before
    bad = copy_model.src.clone()
    bad[0, 0] = copy_model.config.src_vocab_size  # encode refuses it, after the switch to eval
    with pytest.raises(ValueError, match="src"):
        decode(bad, copy_model.src_mask)
    assert modes(model) == before

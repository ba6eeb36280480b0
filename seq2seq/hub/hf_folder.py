"""A Hugging Face checkpoint folder read whole, and checked against itself, before transformers
builds anything from it: every file through ``common.files``, so a damaged one is one
``FileError`` naming it.

    checked = read_folder(Path("opus-mt-en-de"))   # FileError: "PATH: what is wrong", one line
    checked.tensors                                # what the weights file holds, under HF's names
    checked.generation                             # the generation settings, and where they came from

What is checked, in this order:

- ``config.json``: a JSON object of a family the converter reads (``model_type`` marian or
  fsmt); every size a positive integer, the heads dividing ``d_model``, the special ids
  (``pad_token_id``, ``eos_token_id``, ``decoder_start_token_id``, ``bos_token_id``) inside the
  vocabularies they index; what ``TransformerConfig`` cannot express, by field
  (``seq2seq.hub.families``).
- the weights (``model.safetensors``, sharded or not, else ``pytorch_model.bin``, read with
  ``weights_only``): readable, a mapping of names to floating tensors with finite values; each
  stack's layers those the config counts; then name for name and shape for shape the state of
  the model the config describes (Hugging Face's class built on the meta device, so without
  memory): no tensor missing, none unread, none of another shape. A tensor the config ties to
  others (the shared embeddings and generator) may be stored under any one of their names, and
  where several are stored they must be equal; the sinusoid tables may be absent (they are
  recomputed, ``TransformerConfig.positions``). So transformers' ``from_pretrained`` has
  nothing to fill in and nothing to drop.
- the tokenizer's files: ``tokenizer_config.json`` (its settings) and the family's own
  (Marian: ``source.spm``, ``target.spm``, ``vocab.json``, ``target_vocab.json`` where the
  vocabularies are separate; fairseq: ``merges.txt``, ``vocab-src.json``, ``vocab-tgt.json``),
  each present, non-empty and of its kind, the vocabularies holding the special pieces; and
  ``special_tokens_map.json`` and ``added_tokens.json`` where present.
- ``generation_config.json``: a JSON object whose ``bad_words_ids`` (if any) is a list of lists
  of ids, and whose ``decoder_start_token_id`` (if any) is config.json's. Where the folder has
  none, the settings are those transformers derives from ``config.json``
  (``GenerationConfig.from_model_config``), and ``generation_source`` says so.
"""

from __future__ import annotations

import contextlib
import re
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from common.cli import first_line, one_line
from common.files import FileError, read_json, read_text, readable_file, reading
from seq2seq.hub.families import FAMILIES, Family

MODEL_TYPES = {"marian": "MarianMTModel", "fsmt": "FSMTForConditionalGeneration"}
# the sizes both families' configs hold: each a positive integer
SIZES = ("d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads",
         "encoder_ffn_dim", "decoder_ffn_dim", "max_position_embeddings")
HEADS = ("encoder_attention_heads", "decoder_attention_heads")
STACK_LAYERS = {"encoder": "encoder_layers", "decoder": "decoder_layers"}
LAYER = re.compile(r"model\.(encoder|decoder)\.layers\.(\d+)\.")
# the weights files transformers reads, in the order it prefers them
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
           "pytorch_model.bin.index.json")
# each family's tokenizer files (the fixed names its Hugging Face tokenizer saves), and the
# pieces its vocabularies must hold
TOKENIZER_FILES = {"marian": ("source.spm", "target.spm", "vocab.json"),
                   "fairseq": ("merges.txt", "vocab-src.json", "vocab-tgt.json")}
OPTIONAL_TOKENIZER_FILES = ("special_tokens_map.json", "added_tokens.json")
SPECIAL_PIECES = {"marian": ("<unk>", "<pad>", "</s>"), "fairseq": ("<s>", "<pad>", "</s>", "<unk>")}
MOST_PROBLEMS = 4  # named in a refusal; the rest counted


@dataclass(frozen=True)
class CheckedFolder:
    """A folder whose files agree with each other (see the module docstring)."""

    folder: Path
    family: Family  # the family its config.json names
    hf_config: object  # transformers' config of the model, read from config.json
    weights_file: Path  # the weights file (or its index) the tensors were read from
    tensors: Mapping[str, Tensor]  # the weights file's tensors, under their Hugging Face names
    generation: object  # transformers' GenerationConfig the checkpoint's searches run with
    # None when the folder's generation_config.json gave the generation settings; else what
    # stood in for it, in words for the converter's output line
    generation_source: str | None


def read_folder(folder: str | Path) -> CheckedFolder:
    """The checkpoint in ``folder``, every file read and checked (a ``FileError`` names the first
    file that is damaged or disagrees)."""
    transformers = hf_library()
    folder = Path(folder)
    config_path = folder / "config.json"
    raw = read_json(config_path, dict, "a Hugging Face config")
    model_type = raw.get("model_type")
    if model_type not in MODEL_TYPES:
        kind = (f"a {model_type!r} model" if isinstance(model_type, str)
                else "not a model's config (no model_type)")
        raise FileError(config_path, f"is {kind}; the converter reads "
                                     + " and ".join(f"{key} ({cls})" for key, cls in MODEL_TYPES.items()))
    family = FAMILIES[MODEL_TYPES[model_type]]
    _check_raw_sizes(config_path, raw, family)
    # transformers only warns of what _check_config refuses in one line (an id outside its
    # vocabulary): its warning held back, the refusal is the one line the command prints
    with reading(config_path, "a Hugging Face config"), _warnings_held(transformers):
        hf_config = transformers.AutoConfig.from_pretrained(folder)
    _check_config(config_path, hf_config, family)
    expected, twins = _expected_state(config_path, hf_config, family)
    weights_file, tensors = _read_weights(folder)
    _check_layers(config_path, weights_file, hf_config, tensors)
    _check_tensors(config_path, weights_file, family, expected, twins, tensors)
    shared = len({twins.get(name, name) for name in _embedding_names(family)}) == 1
    try:
        family.read_config(hf_config, share_embeddings=shared)
    except ValueError as error:
        raise FileError(config_path, one_line(error)) from None
    _check_tokenizer_files(folder, family)
    generation, source = _read_generation(folder, hf_config)
    return CheckedFolder(folder, family, hf_config, weights_file, tensors, generation, source)


def hf_library():
    """The transformers module, or an ImportError naming the extra that installs it."""
    try:
        import transformers
    except ImportError as error:
        raise ImportError('converting a Hugging Face model needs transformers: '
                          'pip install -e ".[hf]"') from error
    return transformers


@contextlib.contextmanager
def _warnings_held(transformers) -> Iterator[None]:
    """transformers' log at errors only while entered (its verbosity restored after)."""
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers.logging.set_verbosity(verbosity)


# --- config.json ----------------------------------------------------------------------------


def _vocabularies(config: object, family: Family) -> tuple[tuple[str, int], tuple[str, int]]:
    """(field, size) of the source and the target vocabulary."""
    if family.name == "fairseq":
        return ("src_vocab_size", config.src_vocab_size), ("tgt_vocab_size", config.tgt_vocab_size)
    shared = getattr(config, "share_encoder_decoder_embeddings", True)
    target = "vocab_size" if shared else "decoder_vocab_size"
    return ("vocab_size", config.vocab_size), (target, getattr(config, target))


def _is_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_size(value: object) -> bool:
    return _is_id(value) and value > 0


def _check_raw_sizes(path: Path, raw: Mapping[str, object], family: Family) -> None:
    """Each size config.json holds is a positive integer (before transformers reads it)."""
    vocabularies = ("src_vocab_size", "tgt_vocab_size") if family.name == "fairseq" else ("vocab_size",
                                                                                         "decoder_vocab_size")
    for field in (*SIZES, *vocabularies):
        if field in raw and raw[field] is not None and not _is_size(raw[field]):
            raise FileError(path, f"{field} is {raw[field]!r}, not a positive integer")


def _check_config(path: Path, config: object, family: Family) -> None:
    """Sizes positive integers, heads dividing d_model, special ids inside their vocabularies."""
    source, target = _vocabularies(config, family)
    for field, value in (*((field, getattr(config, field, None)) for field in SIZES), source, target):
        if not _is_size(value):
            raise FileError(path, f"{field} is {value!r}, not a positive integer")
    for field in HEADS:
        if config.d_model % getattr(config, field):
            raise FileError(path, f"d_model {config.d_model} is not a multiple of {field} "
                                  f"{getattr(config, field)}")
    # an id indexes the embedding tables it is looked up in
    ids = {"pad_token_id": (source, target), "eos_token_id": (source, target),
           "decoder_start_token_id": (target,), "bos_token_id": (source, target)}
    for field, vocabularies in ids.items():
        value = getattr(config, field, None)
        if value is None and field == "bos_token_id":
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            raise FileError(path, f"{field} is {value!r}, not an integer id")
        for name, size in vocabularies:
            if not 0 <= value < size:
                raise FileError(path, f"{field} {value} is outside the vocabulary of {size} ({name}): "
                                      f"ids are 0..{size - 1}")


# --- the weights ----------------------------------------------------------------------------


def _expected_state(path: Path, config: object, family: Family) -> tuple[dict[str, tuple[int, ...]],
                                                                        dict[str, str]]:
    """The Hugging Face model ``config`` describes, built on the meta device: its state's names
    and shapes, and each tied name -> the first name of its group."""
    cls = getattr(hf_library(), family.architecture)
    try:
        with torch.device("meta"):
            model = cls(config)
    except Exception as error:  # transformers' own checks of a config it cannot build
        raise FileError(path, f"transformers cannot build a {family.architecture} from it "
                              f"({type(error).__name__}: {first_line(error)})") from None
    state = model.state_dict(keep_vars=True)
    first: dict[int, str] = {}
    leaders = {name: first.setdefault(id(tensor), name) for name, tensor in state.items()}
    sizes = Counter(leaders.values())
    twins = {name: leader for name, leader in leaders.items() if sizes[leader] > 1}
    return {name: tuple(tensor.shape) for name, tensor in state.items()}, twins


def _read_weights(folder: Path) -> tuple[Path, dict[str, Tensor]]:
    """The first weights file transformers would read, and its tensors."""
    found = [folder / name for name in WEIGHTS if (folder / name).exists()]
    if not found:
        raise FileError(folder / WEIGHTS[0], f"no such file, nor {', '.join(WEIGHTS[1:])}: "
                                             "the folder holds no weights")
    path = found[0]
    if not path.name.endswith(".index.json"):
        return path, _read_weights_file(path)
    index = read_json(path, dict, "an index of weight shards")
    mapping = index.get("weight_map")
    if not isinstance(mapping, dict) or not all(isinstance(shard, str) for shard in mapping.values()):
        raise FileError(path, "has no weight_map of tensor names to shard files")
    tensors: dict[str, Tensor] = {}
    for shard in sorted(set(mapping.values())):
        held = _read_weights_file(folder / shard)
        wrong = sorted(name for name in held if mapping.get(name) != shard)
        if wrong:
            raise FileError(folder / shard, f"holds {wrong[0]}, which {path.name} does not place there")
        tensors.update(held)
    if missing := sorted(set(mapping) - set(tensors)):
        raise FileError(path, f"places {missing[0]} in {mapping[missing[0]]}, which does not hold it")
    return path, tensors


def _read_weights_file(path: Path) -> dict[str, Tensor]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        with reading(path, "a safetensors file"):
            tensors = load_file(path)
    else:
        with reading(path, "a PyTorch weights file (torch.load, weights_only)"):
            tensors = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(tensors, Mapping):
        raise FileError(path, f"holds a {type(tensors).__name__}, not a state dict (tensor names -> tensors)")
    for name, tensor in tensors.items():
        if not isinstance(name, str) or not isinstance(tensor, Tensor):
            raise FileError(path, f"holds {name!r}: {type(tensor).__name__}, not a state dict of tensors")
        if not tensor.is_floating_point():
            raise FileError(path, f"{name} holds {tensor.dtype} values, not floating point")
        if not torch.isfinite(tensor).all():
            raise FileError(path, f"{name} holds values that are not finite (NaN or infinity)")
    return dict(tensors)


def _spans(numbers: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2, 5"."""
    spans: list[list[int]] = []
    for number in sorted(numbers):
        if spans and number == spans[-1][-1] + 1:
            spans[-1].append(number)
        else:
            spans.append([number])
    return ", ".join(str(span[0]) if len(span) == 1 else f"{span[0]}-{span[-1]}" for span in spans)


def _check_layers(config_path: Path, weights_file: Path, config: object,
                  tensors: Mapping[str, Tensor]) -> None:
    """Each stack's layers in the weights are those config.json counts, or a FileError naming
    the field and the layers' tensors."""
    held: dict[str, set[int]] = {stack: set() for stack in STACK_LAYERS}
    for name in tensors:
        if match := LAYER.match(name):
            held[match.group(1)].add(int(match.group(2)))
    for stack, field in STACK_LAYERS.items():
        count = getattr(config, field)
        if held[stack] == set(range(count)):
            continue
        holds = f"layers {_spans(sorted(held[stack]))}" if held[stack] else "no layers"
        absent = sorted(set(range(count)) - held[stack])
        extra = sorted(held[stack] - set(range(count)))
        said = [f"no model.{stack}.layers.{i}.* tensors" for i in absent[:MOST_PROBLEMS]]
        said += [f"model.{stack}.layers.{i}.* would go unread" for i in extra[:MOST_PROBLEMS]]
        raise FileError(config_path, f"{field} is {count}, but {weights_file} holds {stack} {holds}: "
                                     + "; ".join(said))


def _embedding_names(family: Family) -> list[str]:
    """The Hugging Face names of the source and target embeddings and the generator's weight."""
    names = [family.weight_map[name] for name in ("src_embed.weight", "tgt_embed.weight", "generator.weight")]
    return [getattr(name, "name", name) for name in names]


def _check_tensors(config_path: Path, weights_file: Path, family: Family,
                   expected: Mapping[str, tuple[int, ...]], twins: Mapping[str, str],
                   tensors: Mapping[str, Tensor]) -> None:
    """The weights file holds the state the config describes (see the module docstring)."""
    recomputed = {name for name in family.not_carried if "embed_positions" in name}
    stored = {twins.get(name, name) for name in tensors}
    problems = [f"no {name} (shape {shape})" for name, shape in expected.items()
                if name not in tensors and twins.get(name, name) not in stored and name not in recomputed]
    problems += [f"{name} has shape {tuple(tensor.shape)}, {config_path.name} implies {expected[name]}"
                 for name, tensor in tensors.items()
                 if name in expected and tuple(tensor.shape) != expected[name]]
    problems += [f"{name} is no tensor of the {family.architecture} {config_path.name} describes (unread)"
                 for name in tensors if name not in expected]
    if not problems:
        first: dict[str, str] = {}
        for name, tensor in tensors.items():
            leader = first.setdefault(twins.get(name, name), name)
            if leader != name and not torch.equal(tensor, tensors[leader]):
                problems.append(f"{name} differs from {leader}, which {config_path.name} ties it to "
                                "(one tensor under both names)")
    if problems:
        more = f"; and {len(problems) - MOST_PROBLEMS} more" if len(problems) > MOST_PROBLEMS else ""
        raise FileError(weights_file, f"does not hold the {family.architecture} that {config_path} "
                                      "describes: " + "; ".join(problems[:MOST_PROBLEMS]) + more)


# --- the tokenizer and the generation settings --------------------------------------------------


def _check_tokenizer_files(folder: Path, family: Family) -> None:
    """The tokenizer's files: present, non-empty, each of its kind (see the module docstring)."""
    settings_path = folder / "tokenizer_config.json"
    names = ("tokenizer_config.json", *TOKENIZER_FILES[family.name])
    if not any((folder / name).exists() for name in names):
        raise FileError(settings_path, f"no such file, nor {', '.join(names[1:])}: the folder was saved "
                                       "without its tokenizer (tokenizer.save_pretrained writes them)")
    settings = read_json(settings_path, dict, "a tokenizer's settings")
    for name in OPTIONAL_TOKENIZER_FILES:  # read by transformers' tokenizer where present
        if (folder / name).exists():
            read_json(folder / name, dict, "a tokenizer's settings")
    if family.name == "marian":
        for name in ("source.spm", "target.spm"):
            _check_sentencepiece(folder / name)
        vocabularies = ["vocab.json"] + (["target_vocab.json"] if settings.get("separate_vocabs") else [])
    else:
        languages = settings.get("langs")
        if not (isinstance(languages, list) and len(languages) == 2
                and all(isinstance(language, str) for language in languages)):
            raise FileError(settings_path, f"langs is {languages!r}, not two languages, e.g. ['en', 'de']")
        with reading(folder / "merges.txt", "a file of byte-pair merges"):
            read_text(folder / "merges.txt")
        vocabularies = ["vocab-src.json", "vocab-tgt.json"]
    for name in vocabularies:
        vocabulary = read_json(folder / name, dict, "a vocabulary (piece -> id)")
        if bad := next((piece for piece, i in vocabulary.items()
                        if not isinstance(i, int) or isinstance(i, bool) or i < 0), None):
            raise FileError(folder / name, f"maps {bad!r} to {vocabulary[bad]!r}, not an id")
        if missing := [piece for piece in SPECIAL_PIECES[family.name] if piece not in vocabulary]:
            raise FileError(folder / name, f"lacks the special pieces {', '.join(missing)}")


def _check_sentencepiece(path: Path) -> None:
    from seq2seq.hub.tokenizers import sentencepiece_module

    processor = sentencepiece_module().SentencePieceProcessor()
    readable_file(path)
    with reading(path, "a sentencepiece model"):
        processor.LoadFromSerializedProto(path.read_bytes())


def _read_generation(folder: Path, config: object) -> tuple[object, str | None]:
    """The checkpoint's generation settings and, where the folder has no generation_config.json,
    what stood in for it."""
    transformers = hf_library()
    path = folder / "generation_config.json"
    if not path.exists():
        return (transformers.GenerationConfig.from_model_config(config),
                "no generation_config.json: the settings transformers derives from config.json")
    settings = read_json(path, dict, "a generation config")
    words = settings.get("bad_words_ids")
    if words is not None and not (isinstance(words, list) and all(
            isinstance(word, list) and word and all(_is_id(i) for i in word) for word in words)):
        raise FileError(path, f"bad_words_ids is {words!r}, not a list of lists of ids")
    start = settings.get("decoder_start_token_id")
    if start is not None and start != config.decoder_start_token_id:
        raise FileError(path, f"decoder_start_token_id is {start!r}, config.json's is "
                              f"{config.decoder_start_token_id}: generate would start the decoder with the "
                              "one, the converted model with the other")
    with reading(path, "a generation config"):
        return transformers.GenerationConfig.from_dict(settings), None

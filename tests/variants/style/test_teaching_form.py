"""The three teaching variants read like their sources (docs/architecture.md, "Teaching form").

Each attention's ``forward`` holds the whole computation in the source's order (project, split
heads, attend, merge, output projection) instead of handing it to helpers; scores are divided
after the product, as the sources write them; what the suite adds for incremental decoding sits
below the teaching path, under a marked section. The checks read the source text (``ast``):
what they guard is how the code reads, which running it cannot show.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
TEACHING_PACKAGES = ("explicit", "einsum", "mathfirst")
ALL_VARIANT_FILES = sorted([*(ROOT / "variants").glob("*/*.py"), ROOT / "variants" / "reference.py"])
TEACHING_FILES = [path for path in ALL_VARIANT_FILES if path.parent.name in TEACHING_PACKAGES]
MODEL_FILES = [path for path in ALL_VARIANT_FILES if path.name in ("model.py", "reference.py")]

# a section of what the suite adds, e.g. "# --- incremental decoding: the suite's addition, ..."
SUITE_SECTION = re.compile(r"^\s*# --- (?P<what>[^:]+): the suite's addition")
INCREMENTAL = "incremental decoding"
CACHE_METHODS = {"step", "start_cache", "_start_cache", "_decode_step"}
# what the cache methods share with forward: keys/values projected once, attention over them
CACHE_HELPERS = {"keys_values", "attend", "project"}


@dataclass(frozen=True)
class Attention:
    """Where a variant's attention lives and what its source's forward is made of."""

    path: str
    cls: str
    inputs: tuple[str, str, str]  # the Q, K, V projections (attributes of self)
    output: str  # the output projection
    split: tuple[str, ...]  # the methods that split a projection into heads, innermost first
    teaching: frozenset[str]  # the methods above the suite's sections


EXPLICIT = Attention("variants/explicit/model.py", "MultiHeadAttention", ("wq", "wk", "wv"), "wo",
                     ("view", "transpose"), frozenset({"__init__", "attention", "forward"}))
EINSUM = Attention("variants/einsum/self_attention.py", "SelfAttention", ("queries", "keys", "values"),
                   "fc_out", ("reshape",), frozenset({"__init__", "forward"}))
MATHFIRST = Attention("variants/mathfirst/components.py", "MultiHeadAttention", ("W_q", "W_k", "W_v"),
                      "W_o", (), frozenset({"__init__", "forward"}))
ATTENTIONS = pytest.mark.parametrize("attention", [EXPLICIT, EINSUM, MATHFIRST],
                                     ids=["explicit", "einsum", "mathfirst"])


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def find_class(tree: ast.Module, name: str) -> ast.ClassDef:
    (cls,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name]
    return cls


def methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef]:
    return {node.name: node for node in cls.body if isinstance(node, ast.FunctionDef)}


def is_self_attribute(node: ast.AST, name: str) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == name
            and isinstance(node.value, ast.Name) and node.value.id == "self")


def calls(tree: ast.AST) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)]


def callee_name(call: ast.Call) -> str | None:
    """``f`` for ``f(...)``, ``torch.f(...)`` and ``x.f(...)``."""
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def einsum_patterns(tree: ast.AST) -> list[tuple[ast.Call, str]]:
    """Every einsum call and its pattern: torch's (pattern first) and einops' (pattern last)."""
    found = []
    for call in calls(tree):
        if callee_name(call) == "einsum":
            strings = [arg.value for arg in call.args
                       if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
            assert len(strings) == 1, f"line {call.lineno}: an einsum without one pattern string"
            found.append((call, strings[0]))
    return found


def split_chain(node: ast.AST, split: tuple[str, ...]) -> ast.AST | None:
    """For ``inner.view(...).transpose(...)`` and split ("view", "transpose"): ``inner``."""
    for method in reversed(split):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == method):
            return None
        node = node.func.value
    return node


def projection_lines(forward: ast.FunctionDef, attention: Attention) -> dict[str, int]:
    """Each input projection -> the line where forward projects with it and splits into heads."""
    lines = {}
    for name in attention.inputs:
        if attention.split:  # explicit, einsum: self.wq(q).view(...).transpose(1, 2)
            hits = [call for call in calls(forward)
                    if (inner := split_chain(call, attention.split)) is not None
                    and isinstance(inner, ast.Call) and is_self_attribute(inner.func, name)]
        else:  # mathfirst: einsum(Q, self.W_q, "b t d, h d k -> b h t k"): a head axis h out
            hits = [call for call, pattern in einsum_patterns(forward)
                    if any(is_self_attribute(arg, name) for arg in call.args)
                    and "h" in pattern.split("->")[1].split()]
        assert hits, f"{attention.cls}.forward does not project with {name} and split the heads"
        lines[name] = hits[0].lineno
    return lines


# --- the attention's forward is the whole computation, in the source's order ----------------


@ATTENTIONS
def test_forward_projects_splits_attends_merges_and_projects_out(attention):
    cls = find_class(parse(ROOT / attention.path), attention.cls)
    forward = methods(cls)["forward"]
    projected = projection_lines(forward, attention)

    # attend: the source's own attention step
    if attention is EXPLICIT:  # MultiHeadAttention.attention(query, key, value, self.dropout, mask)
        attend = [call for call in calls(forward) if callee_name(call) == "attention"]
    elif attention is EINSUM:  # energy, then the weighted sum, with the source's letters
        patterns = {pattern.replace(" ", ""): call for call, pattern in einsum_patterns(forward)}
        assert {"nqhd,nkhd->nhqk", "nhql,nlhd->nqhd"} <= patterns.keys(), patterns.keys()
        attend = [patterns["nqhd,nkhd->nhqk"]]
    else:  # eq. 1
        attend = [call for call in calls(forward) if callee_name(call) == "scaled_dot_product_attention"]
    assert len(attend) == 1, f"{attention.cls}.forward does not attend exactly once"

    # merge the heads, then the output projection, as forward's result
    (returned,) = [node for node in ast.walk(forward) if isinstance(node, ast.Return)]
    if attention is MATHFIRST:  # Σ_h head_h W_o^h + b_o: the merge is the sum over h
        merges = [call for call, pattern in einsum_patterns(returned)
                  if any(is_self_attribute(arg, attention.output) for arg in call.args)
                  and "h" in pattern.split("->")[0] and "h" not in pattern.split("->")[1]]
        assert merges, "mathfirst's forward does not sum its heads through W_o"
        output_line = merges[0].lineno
    else:
        assert isinstance(returned.value, ast.Call)
        assert is_self_attribute(returned.value.func, attention.output)
        merge = ("transpose", "contiguous", "view") if attention is EXPLICIT else ("reshape",)
        # a merge reshapes the attended heads, not a projection (that is the split)
        merges = [call for call in calls(forward) if (inner := split_chain(call, merge)) is not None
                  and not (isinstance(inner, ast.Call)
                           and any(is_self_attribute(inner.func, name) for name in attention.inputs))]
        assert merges, f"{attention.cls}.forward does not merge its heads with {'.'.join(merge)}"
        output_line = returned.lineno
        assert max(projected.values()) < merges[0].lineno < output_line

    assert max(projected.values()) < attend[0].lineno < output_line, "not in the source's order"


@ATTENTIONS
def test_forward_hands_nothing_to_the_suites_helpers(attention):
    """Forward calls no other method of its class (explicit's static ``attention`` is source 1's)."""
    cls = find_class(parse(ROOT / attention.path), attention.cls)
    own = set(methods(cls)) - {"attention"}
    forward = methods(cls)["forward"]
    delegated = sorted({call.func.attr for call in calls(forward)
                        if isinstance(call.func, ast.Attribute) and call.func.attr in own
                        and isinstance(call.func.value, ast.Name) and call.func.value.id == "self"})
    assert not delegated, f"{attention.cls}.forward hands its work to {delegated}"


def test_explicit_attention_takes_source_ones_arguments():
    cls = find_class(parse(ROOT / EXPLICIT.path), EXPLICIT.cls)
    arguments = [arg.arg for arg in methods(cls)["attention"].args.args]
    assert arguments == ["q", "k", "v", "dropout", "mask"]


# --- the suite's additions sit below the teaching path -------------------------------------


def sections(path: Path, cls: ast.ClassDef) -> list[tuple[int, str]]:
    """(line, what) of every suite section marked inside the class."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [(number, match["what"]) for number in range(cls.lineno, cls.end_lineno + 1)
            if (match := SUITE_SECTION.match(lines[number - 1]))]


@ATTENTIONS
def test_attention_opens_with_the_teaching_path_and_decodes_below_it(attention):
    path = ROOT / attention.path
    cls = find_class(parse(path), attention.cls)
    marked = sections(path, cls)
    assert marked and marked[0][1] == INCREMENTAL, f"{attention.cls} has no incremental decoding section"
    first = marked[0][0]
    above = {name for name, node in methods(cls).items() if node.lineno < first}
    assert above == attention.teaching
    below = {name for name, node in methods(cls).items() if node.lineno > first}
    assert "step" in below


def classes_with_cache_methods() -> list[tuple[Path, str]]:
    return [(path, node.name) for path in TEACHING_FILES for node in parse(path).body
            if isinstance(node, ast.ClassDef) and CACHE_METHODS & set(methods(node))]


@pytest.mark.parametrize(("path", "name"), classes_with_cache_methods(),
                         ids=[f"{path.parent.name}/{path.name}::{name}"
                              for path, name in classes_with_cache_methods()])
def test_every_cache_method_is_in_its_classs_marked_section(path, name):
    cls = find_class(parse(path), name)
    marked = sections(path, cls)
    starts = [line for line, what in marked if what == INCREMENTAL]
    assert len(starts) == 1, f"{name} needs one '# --- {INCREMENTAL}: the suite's addition' section"
    start = starts[0]
    end = min([line for line, _ in marked if line > start], default=cls.end_lineno + 1)
    for method, node in methods(cls).items():
        inside = start < node.lineno < end
        if method in CACHE_METHODS:
            assert inside, f"{name}.{method} is outside the incremental decoding section"
        elif inside:
            assert method in CACHE_HELPERS, f"{name}.{method} is not decoding, yet in its section"


def test_the_section_check_reaches_every_decoding_class():
    """Attention, decoder layer, decoder and model in each teaching variant (einsum's
    TransformerBlock too): the check above is not vacuous."""
    found = {(path.parent.name, name) for path, name in classes_with_cache_methods()}
    layers = (("explicit", "DecoderBlock"), ("einsum", "DecoderBlock"), ("mathfirst", "DecoderLayer"))
    for variant, layer in layers:
        assert {(variant, "Transformer"), (variant, "Decoder"), (variant, layer)} <= found
    assert {("explicit", "MultiHeadAttention"), ("einsum", "SelfAttention"), ("einsum", "TransformerBlock"),
            ("mathfirst", "MultiHeadAttention")} <= found


# --- scores and norms as the sources write them --------------------------------------------


def score_product(node: ast.AST) -> bool:
    """A score product: a matmul or an einsum call."""
    return ((isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult))
            or (isinstance(node, ast.Call) and callee_name(node) == "einsum"))


def divided(node: ast.AST) -> bool:
    return isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)


@pytest.mark.parametrize("path", TEACHING_FILES, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_no_operand_is_divided_before_a_product(path):
    """Q K^T / sqrt(d_k), never (Q / sqrt(d_k)) K^T: the scaling follows the product."""
    for node in ast.walk(parse(path)):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            operands = [node.left, node.right]
        elif isinstance(node, ast.Call) and callee_name(node) == "einsum":
            operands = node.args
        else:
            continue
        assert not any(divided(operand) for operand in operands), \
            f"{path.name}:{node.lineno} divides an operand before the product"


@pytest.mark.parametrize(("path", "function"), [
    (EXPLICIT.path, "attention"), (EINSUM.path, "forward"), ("variants/mathfirst/components.py",
                                                              "attention_weights")])
def test_scores_are_the_product_divided_by_sqrt_d_k(path, function):
    """The score line itself: a product (or the name holding one) divided by a math.sqrt."""
    tree = parse(ROOT / path)
    (node,) = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == function]
    products = {target.id for assign in ast.walk(node) if isinstance(assign, ast.Assign)
                and score_product(assign.value) for target in assign.targets if isinstance(target, ast.Name)}
    scores = [division for division in ast.walk(node) if divided(division)
              and (score_product(division.left)
                   or (isinstance(division.left, ast.Name) and division.left.id in products))
              and isinstance(division.right, ast.Call) and callee_name(division.right) == "sqrt"]
    assert len(scores) == 1, f"{function} has no 'product / sqrt(d_k)' line"


@pytest.mark.parametrize("path", TEACHING_FILES, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_no_speed_tricks_of_their_own(path):
    """No rsqrt (LayerNorm divides by sqrt(var + eps)) and no remark on kernels or numbers touched:
    speed belongs to the fused variant and docs/benchmarks.md."""
    text = path.read_text(encoding="utf-8")
    names = {node.attr for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Attribute)}
    assert "rsqrt" not in names
    assert not re.search(r"\bkernels?\b|\btouches\b", text, flags=re.I)


# --- one notation for the canonical maps, in every variant ---------------------------------

MAPS = ("weight_map", "tied_weight_map", "probe_map")


def literal_target(node: ast.AST) -> bool:
    """A literal name pattern, None, or Param(...)/Probe(...) of literal arguments."""
    if isinstance(node, ast.Constant):
        return node.value is None or isinstance(node.value, str)
    return (isinstance(node, ast.Call) and callee_name(node) in ("Param", "Probe")
            and all(isinstance(arg, ast.Constant) for arg in node.args)
            and all(isinstance(keyword.value, (ast.Constant, ast.Tuple)) for keyword in node.keywords))


def declared_maps() -> list[tuple[Path, str, ast.AnnAssign]]:
    found = []
    for path in MODEL_FILES:
        for cls in parse(path).body:
            if isinstance(cls, ast.ClassDef):
                found += [(path, node.target.id, node) for node in cls.body
                          if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                          and node.target.id in MAPS]
    return found


@pytest.mark.parametrize(("path", "name", "node"), declared_maps(),
                         ids=[f"{path.parent.name}/{path.name}::{name}" for path, name, _ in declared_maps()])
def test_maps_are_one_literal_dict_of_written_out_patterns(path, name, node):
    """Each key a whole canonical pattern as a string literal (no constants, no concatenation),
    each value a literal; at most two comment lines above, none between the entries."""
    assert isinstance(node.value, ast.Dict), f"{name} is not a dict literal"
    assert all(isinstance(key, ast.Constant) and isinstance(key.value, str) for key in node.value.keys)
    assert all(literal_target(value) for value in node.value.values), f"{name} has a computed value"
    lines = path.read_text(encoding="utf-8").splitlines()
    above = 0
    while lines[node.lineno - 2 - above].strip().startswith("#"):
        above += 1
    assert above <= 2, f"{name} has {above} comment lines above it"
    inside = [line for line in lines[node.lineno : node.end_lineno - 1] if line.strip().startswith("#")]
    assert not inside, f"{name} has comment lines between its entries: {inside}"


def test_every_variant_declares_its_maps():
    declared = {(path.parent.name if path.name == "model.py" else "torch", name)
                for path, name, _ in declared_maps()}
    for variant in ("explicit", "einsum", "mathfirst", "fused", "torch"):
        assert {(variant, "weight_map"), (variant, "probe_map")} <= declared, variant


@pytest.mark.parametrize("path", TEACHING_FILES, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_a_probability_is_named_dropout_p(path):
    """An attribute holding config.dropout is ``dropout_p``; ``dropout`` is an nn.Dropout."""
    for node in ast.walk(parse(path)):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute)
                and node.value.attr == "dropout"):
            for target in node.targets:
                if isinstance(target, ast.Attribute):
                    assert target.attr == "dropout_p", \
                        f"{path.name}:{node.lineno} names a probability {target.attr}"


LONGEST_FILE = 400  # lines: a file in variants/ is read top to bottom, in one sitting


@pytest.mark.parametrize("path", sorted((ROOT / "variants").rglob("*.py")),
                         ids=lambda path: str(path.relative_to(ROOT)))
def test_no_file_in_variants_is_longer_than_a_sitting(path):
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= LONGEST_FILE, f"{path.relative_to(ROOT)} has {lines} lines (at most {LONGEST_FILE})"

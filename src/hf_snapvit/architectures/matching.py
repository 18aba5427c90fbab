"""Which of a block's ``nn.Linear`` calls are the attention's query, key, value and output projections and which the
FFN's (:mod:`.discovery` reads a spec from them), from one traced forward (:class:`~.tracing.Trace`).

Only layers that take or give the block's hidden width can be these projections; the others (timm's
relative-position MLP, ``2 -> 128 -> heads``, run between its qkv and its output projection) are set aside. An
attention is a module whose own such calls are three projections to one attention width and one back (or one fused
projection to three times that width and one back). A block with several (X-CLIP's message attention over its frames'
class tokens, TimeSformer's temporal attention over each patch's frames) is pruned in the one that attends over the
most tokens, the block's own; two over the same tokens (timm's ``*_18x2_*`` blocks) are refused, as is one
projection that computes q, k, v and the FFN input at once (timm's ``*_xp_*`` parallel-scaling blocks). Where no
module holds exactly an attention's calls, the calls are read in order: q, k and v (or a fused qkv) first, then the
output projection, then the FFN.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn as nn

from ..errors import UnsupportedArchitectureError
from .structure import by_role
from .tracing import Trace

Call = tuple[str, nn.Linear]


@dataclass(frozen=True)
class Match:
    """The projections of one block: attention (``qkv`` three calls, or one fused call three times) and FFN."""

    qkv: tuple[Call, Call, Call]
    o: Call
    ups: tuple[Call, ...]
    down: Call
    fused: bool
    attention: str  #: the closest common parent of the attention's projections (``""``: the block)
    mlp: str  #: the same for the FFN's
    width: int  #: the attention width (heads × head width)
    side: tuple[Call, ...]  #: the calls that neither take nor give the hidden width


def parent(paths: list[str]) -> str:
    """The closest common parent of dotted paths (``""``: the block itself)."""
    parts = [p.split(".")[:-1] for p in paths]
    common = []
    for names in zip(*parts):
        if len(set(names)) > 1:
            break
        common.append(names[0])
    return ".".join(common)


def under(name: str, path: str) -> bool:
    """Whether the dotted ``name`` lies inside the module at ``path`` (``""``: the block)."""
    return not path or name.startswith(path + ".")


def _attention(calls: list[Call], hidden: int) -> tuple[list[Call], bool] | None:
    """``calls`` as one attention's projections, q/k/v first (fused or not), else ``None``."""
    if len(calls) == 2:
        (_, first), (_, out) = calls
        if first.in_features == hidden and first.out_features == 3 * out.in_features and out.out_features == hidden:
            return calls, True
    if len(calls) == 4:
        *qkv, (_, out) = calls
        if all(m.in_features == hidden and m.out_features == out.in_features for _, m in qkv) and (
                out.out_features == hidden):
            return [*by_role(qkv), calls[3]], False
    return None


def _attentions(calls: list[Call], hidden: int) -> list[tuple[list[Call], bool]]:
    """Every distinct set of calls that one module of the block holds exactly and that is an attention's."""
    found: dict[tuple[str, ...], tuple[list[Call], bool]] = {}
    for path in dict.fromkeys(p for name, _ in calls for p in _prefixes(name)):
        own = [call for call in calls if under(call[0], path)]
        match = _attention(own, hidden)
        if match is not None:
            found.setdefault(tuple(name for name, _ in own), match)
    return list(found.values())


def _prefixes(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(len(parts))]


def match_block(trace: Trace, model: str, block: str) -> Match:
    """The projections of the block ``trace`` shows (``model``: the model's name, ``block``: the block's place in
    it, for refusals).

    Raises:
        UnsupportedArchitectureError: the calls hold no attention and FFN, two attentions over the same tokens, or one
            projection feeding both.
    """
    calls = trace.calls
    hidden = trace.hidden or (calls[0][1].in_features if calls else 0)
    touching = [(n, m) for n, m in calls if hidden in (m.in_features, m.out_features)]
    side = tuple((n, m) for n, m in calls if hidden not in (m.in_features, m.out_features))
    groups = _attentions(touching, hidden)
    if len(groups) > 1:
        tokens = [trace.call_tokens.get(group[0][0][0], 0) for group in groups]
        widest = [group for group, count in zip(groups, tokens) if count == max(tokens)]
        if len(widest) > 1:
            names = [parent([n for n, _ in group[0]]) or "the block" for group in widest]
            raise UnsupportedArchitectureError(
                f"This {model} is not a ViT hf_snapvit can prune: block 0 of {block} has two attention modules in "
                f"one block ({', '.join(names)}) over the same tokens (timm's *_18x2_* blocks run two attentions and "
                "two FFNs); hf_snapvit prunes blocks of one attention and one FFN.")
        groups = widest
    if groups:
        projections, fused = groups[0]
        others = {n for group in _attentions(touching, hidden) for n, _ in group[0]} - {n for n, _ in projections}
        after = touching.index(projections[-1]) + 1
        rest = [call for call in touching[after:] if call[0] not in others]
    else:
        where = f"block 0 of {block} of this {model}"
        projections, fused, rest = _in_order(touching, hidden, model, where)
    *qkv, o = projections
    q = qkv[0]
    width = o[1].in_features
    ups = [(n, m) for n, m in rest if m.in_features == hidden and m.out_features != hidden]
    # A packed FFN (timm's GluMlp) computes value and gate in one projection of twice the neurons.
    downs = [(n, m) for n, m in rest if m.out_features == hidden and ups
             and ups[0][1].out_features in (m.in_features, 2 * m.in_features)]
    square = [(n, m) for n, m in rest if m.in_features == m.out_features == hidden]
    if not ups and len(square) == len(rest) in (2, 3):  # an FFN as wide as the model: the last call is its output
        ups, downs = square[:-1], square[-1:]
    if not ups or not downs:
        after = [(n, m.in_features, m.out_features) for n, m in rest][:6]
        raise UnsupportedArchitectureError(
            f"hf_snapvit found no FFN ({hidden} -> n -> {hidden}) after the attention's output projection {o[0]!r} "
            f"in block 0 of {block} of this {model}; its nn.Linear calls after it: {after}. Register an "
            "ArchitectureSpec naming the FFN's projections.")
    ups = ups[:2] if len(ups) > 1 and ups[1][1].out_features == ups[0][1].out_features else ups[:1]
    qkv_calls = (q, q, q) if fused else tuple(qkv)
    return Match(qkv_calls, o, tuple(ups), downs[0], fused, parent([n for n, _ in projections]),
                 parent([*(n for n, _ in ups), downs[0][0]]), width, side)


def _in_order(calls: list[Call], hidden: int, model: str, where: str) -> tuple[list[Call], bool, list[Call]]:
    """q, k and v (or one fused qkv) as the first calls, then the output projection: ``(projections, fused, the
    calls after them)``."""
    shared = _shared_input(calls, hidden)
    if shared:
        raise UnsupportedArchitectureError(
            f"This {model} is not a ViT hf_snapvit can prune: in {where.split(' of this ')[0]}, one projection "
            f"({shared}) computes q, k, v and the FFN input at once (a parallel-scaling block, as timm's *_xp_* ViTs "
            "have), which cannot be cut into heads and neurons.")
    first, second = (calls + [None, None])[:2]
    fused = first is not None and second is not None and first[1].out_features == 3 * second[1].in_features and \
        second[1].out_features == first[1].in_features
    if len(calls) < (3 if fused else 5):
        raise UnsupportedArchitectureError(
            f"This {model} is not a vision transformer hf_snapvit can prune: {where.split(' of this ')[0]} runs "
            f"{len(calls)} nn.Linear layers of its width ({[n for n, _ in calls][:6]}), where a ViT block runs an "
            "attention (query, key, value, output projections) and an FFN.")
    width = first[1].out_features // (3 if fused else 1)
    qkv = [first] * 3 if fused else by_role(calls[:3])
    if not fused and any(m.in_features != hidden or m.out_features != width for _, m in qkv):
        raise UnsupportedArchitectureError(
            f"hf_snapvit could not match query, key and value projections in {where}: its first three nn.Linear "
            f"calls are {[(n, m.in_features, m.out_features) for n, m in qkv]}, expected three {hidden} -> {width} "
            "(keys and values of another width, as in grouped-query attention, are not supported).")
    after = 1 if fused else 3
    o = calls[after]
    if o[1].in_features != width or o[1].out_features != hidden:
        raise UnsupportedArchitectureError(
            f"hf_snapvit found no output projection ({width} -> {hidden}) after q, k, v in {where}: the next "
            f"nn.Linear call is {(o[0], o[1].in_features, o[1].out_features)}. Register an ArchitectureSpec naming "
            "the attention's projections.")
    return [*(qkv[:1] if fused else qkv), o], fused, calls[after + 1:]


def _shared_input(calls: list[Call], hidden: int) -> str:
    """``"name, D -> X"`` of a first projection whose rows are a fused qkv's and an FFN's input together (X = 3W + F,
    or 3W + 2F for a packed gated FFN, W the width a later output projection takes, F a later FFN output's), else
    ``""``."""
    if not calls or calls[0][1].in_features != hidden:
        return ""
    name, first = calls[0]
    backs = [m.in_features for _, m in calls[1:] if m.out_features == hidden]
    for w in backs:
        for f in backs:
            if f != w and first.out_features in (3 * w + f, 3 * w + 2 * f):
                return f"{name}, {hidden} -> {first.out_features}"
    return ""

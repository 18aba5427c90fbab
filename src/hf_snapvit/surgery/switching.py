"""Switching a model's width in place: every projection computes with a prefix view of its full weight.

An elastic checkpoint stores each block's heads and FFN neurons in rank order, so every budget keeps a *prefix* of
every projection: the first rows of q/k/v and of the FFN input projections, the first columns of the attention and
FFN output projections. :class:`PrefixLinear` is an ``nn.Linear`` whose ``out_features`` / ``in_features`` may be
smaller than its weight: it multiplies by ``weight[:out_features, :in_features]``, a view (row prefixes are contiguous;
column prefixes are strided, which matrix products take without a copy). Switching size therefore sets a few
integers per block and never copies, allocates or frees a weight. Parameters keep their full shape, so
``state_dict`` stays the dense checkpoint and gradients reach exactly the active prefix. A per-head table (BEiT's
relative position bias) is stored in rank order too: its module still builds every head's bias, and a
:class:`HeadPrefix` hook passes on the first heads' only; a layer of one row per head (timm's relative-position
MLP) is a :class:`PrefixLinear` that computes the first heads' rows. A :class:`SwitchGate` keeps switches and forward
passes of different threads apart, so that no forward pass computes some blocks at one size and the rest at another.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import PreTrainedModel

from ..architectures import (ArchitectureSpec, ffn_inputs, get_attention, get_layers, get_mlp, get_projection,
                             get_spec, head_dim, head_rows, head_tables, num_heads, qkv_projections)
from ..errors import BudgetError, UnsupportedArchitectureError
from .threads import one_thread
from .slicing import OUTPUT_KINDS, set_head_count_


class PrefixLinear(nn.Linear):
    """An ``nn.Linear`` that uses the first ``out_features`` rows and first ``in_features`` columns of its weight.

    ``in_features`` and ``out_features`` say what the layer computes now, as on any ``nn.Linear``; the weight keeps
    its full (capacity) shape; a fused projection uses the same prefix of each of its blocks (:meth:`active`). Built
    by :func:`make_switchable_` from an existing ``nn.Linear`` (its class is swapped, its parameters are kept).
    """

    def active(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The weight and bias the layer computes with now: prefix views, or for a fused projection of
        ``row_blocks`` blocks (query, key, value; a packed FFN's value and gate) the same prefix of each block (a copy:
        those rows are not contiguous)."""
        weight, bias = self.weight, self.bias
        if self.out_features != weight.shape[0]:
            blocks = self.__dict__.get("row_blocks", 1)
            if blocks == 1:
                weight = weight[: self.out_features]
                bias = None if bias is None else bias[: self.out_features]
            else:
                rows = self.out_features // blocks
                weight = weight.unflatten(0, (blocks, -1))[:, :rows].flatten(0, 1)
                bias = None if bias is None else bias.unflatten(0, (blocks, -1))[:, :rows].flatten()
        if self.in_features != weight.shape[1]:
            weight = weight[:, : self.in_features]
        return weight, bias

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 (nn.Linear's own argument name)
        corrected = self._buffers.get("corrected")
        if corrected is not None and corrected.shape[1] == self.in_features:
            return F.linear(input, corrected, self.bias)  # an output projection's weight corrected for this size
        return F.linear(input, *self.active())


class HeadPrefix:
    """Forward hook on the module that turns a per-head table into attention biases ``[..., heads, N, N]``: it keeps
    the first ``heads`` of them. ``capacity`` is how many the table holds."""

    def __init__(self, capacity: int, heads: int) -> None:
        self.capacity, self.heads = capacity, heads

    def __call__(self, module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        # Which output dimension holds the heads is the module's business: check it, rather than cut another one.
        if output.ndim < 3 or output.shape[-3] != self.capacity:
            raise UnsupportedArchitectureError(
                f"{type(module).__name__} returned a bias of shape {tuple(output.shape)}; a switchable model needs "
                f"[..., heads={self.capacity}, N, N]. Load this model at one size with from_pretrained(path, "
                "sparsity=...) instead of switchable=True."
            )
        return output if self.heads == self.capacity else output[..., : self.heads, :, :]


def remove_head_prefixes_(model: nn.Module) -> None:
    """Take every :class:`HeadPrefix` hook off ``model``'s modules (a physically sliced copy needs none)."""
    for module in model.modules():
        for key in [k for k, hook in module._forward_hooks.items() if isinstance(hook, HeadPrefix)]:
            del module._forward_hooks[key]


@dataclass(frozen=True)
class SwitchBlock:
    """The modules a switch of one block touches, looked up once, so that a switch only writes integers."""

    attention: nn.Module
    qkv: tuple[nn.Linear, ...]  # each distinct q/k/v projection once (one fused qkv, or three)
    o_proj: nn.Linear
    ffn_in: tuple[nn.Linear, ...]
    ffn_out: nn.Linear
    head_width: int
    tables: tuple[tuple[nn.Module, HeadPrefix], ...] = ()
    row_blocks: tuple[int, ...] = ()  # per q/k/v projection: 3 for a fused qkv (query, key, value), else 1
    ffn_blocks: tuple[int, ...] = ()  # per FFN input projection: 2 for a packed value and gate, else 1
    head_rows: tuple[nn.Linear, ...] = ()  # layers of one output row per head (a relative-position MLP's last)


def switch_blocks(model: PreTrainedModel) -> list[SwitchBlock]:
    """Every block's q/k/v, attention output, FFN input and FFN output projections and per-head tables (each with
    the hook :func:`make_switchable_` puts on its module), in depth order."""
    spec = get_spec(model)
    blocks = []
    for layer in get_layers(model, spec):
        attention = get_attention(layer, spec)
        mlp, variant = get_mlp(layer, spec)
        qkv, row_blocks = zip(*qkv_projections(attention, spec))
        tables = tuple((owner, HeadPrefix(getattr(owner, name).shape[-1], num_heads(attention, spec)))
                       for owner, name in head_tables(layer, spec))
        ffn_in, ffn_blocks = zip(*ffn_inputs(mlp, variant))
        blocks.append(SwitchBlock(attention, qkv, get_projection(attention, spec.o_proj), ffn_in,
                                  get_projection(mlp, variant.out_proj), head_dim(attention, spec), tables,
                                  row_blocks, ffn_blocks, tuple(head_rows(layer, spec))))
    return blocks


def make_switchable_(model: PreTrainedModel) -> list[SwitchBlock]:
    """Turn every prunable projection of ``model`` into a :class:`PrefixLinear`, in place, at its current width.

    Only the class of those modules changes: parameters, buffers and outputs are untouched. Returns the blocks that
    :func:`set_widths_` switches.

    Raises:
        UnsupportedArchitectureError: a projection is not a plain ``nn.Linear`` (quantised or adapter-wrapped layers
            have their own forward, which prefix views would bypass).
    """
    blocks = switch_blocks(model)
    for index, block in enumerate(blocks):
        for linear in (*block.qkv, block.o_proj, *block.ffn_in, block.ffn_out, *block.head_rows):
            if type(linear) not in (nn.Linear, PrefixLinear):
                raise UnsupportedArchitectureError(
                    f"Block {index} has a {type(linear).__module__}.{type(linear).__name__} projection; a switchable "
                    "model needs plain torch.nn.Linear projections. Make the model switchable before quantising it "
                    "or adding adapters, or load it at one size with from_pretrained(path, sparsity=...)."
                )
    remove_head_prefixes_(model)
    for block in blocks:
        for linear in (*block.qkv, block.o_proj, *block.ffn_in, block.ffn_out, *block.head_rows):
            linear.__class__ = PrefixLinear
        for linear, count in zip((*block.qkv, *block.ffn_in), (*block.row_blocks, *block.ffn_blocks)):
            linear.row_blocks = count  # read by PrefixLinear.active
        for linear in (block.o_proj, block.ffn_out):  # what a prefix correction replaces at reduced sizes
            if "corrected" not in linear._buffers:
                linear.register_buffer("corrected", None, persistent=False)
        for module, hook in block.tables:
            module.register_forward_hook(hook)
    return blocks


def capacity(blocks: Sequence[SwitchBlock]) -> tuple[list[int], list[int]]:
    """``(heads, neurons)`` per block that the weights hold (the largest widths a switchable model can switch to)."""
    return ([b.o_proj.weight.shape[1] // b.head_width for b in blocks], [b.ffn_out.weight.shape[1] for b in blocks])


def set_widths_(spec: ArchitectureSpec, blocks: Sequence[SwitchBlock], heads: Sequence[int],
                neurons: Sequence[int]) -> None:
    """Make every block compute with its first ``heads[l]`` heads and ``neurons[l]`` FFN neurons, in place. Only
    integers change; the caller checks the widths against :func:`capacity`."""
    for block, h, f in zip(blocks, heads, neurons):
        rows = int(h) * block.head_width
        for linear, count in zip(block.qkv, block.row_blocks):
            linear.out_features = rows * count
        block.o_proj.in_features = rows
        for linear, count in zip(block.ffn_in, block.ffn_blocks):
            linear.out_features = int(f) * count
        block.ffn_out.in_features = int(f)
        for _, hook in block.tables:
            hook.heads = int(h)
        for linear in block.head_rows:
            linear.out_features = int(h)
        set_head_count_(block.attention, spec, int(h), block.head_width)


def install_corrections_(blocks: Sequence[SwitchBlock], source: Any) -> None:
    """Give every output projection that computes with fewer columns than it holds the corrected weight of its
    current width from ``source`` (a prefix correction, see :func:`hf_snapvit.elastic.prefix_file.correct_widths_`);
    at full width, or with ``source`` ``None``, it computes with its own weight again. A projection whose width did
    not change keeps the corrected weight it has (it depends on the width alone). The solves run on one thread
    (:func:`~hf_snapvit.surgery.threads.one_thread`)."""
    with one_thread():
        for index, block in enumerate(blocks):
            for kind, linear in zip(OUTPUT_KINDS, (block.o_proj, block.ffn_out)):
                held = linear._buffers.get("corrected")
                if source is None or linear.in_features == linear.weight.shape[1]:
                    linear.corrected = None
                elif held is None or held.shape[1] != linear.in_features:
                    new = source.weight(index, kind, linear.in_features, linear.weight)
                    linear.corrected = new.to(dtype=linear.weight.dtype, device=linear.weight.device)


class SwitchGate:
    """Keeps the forward passes and the switches of one switchable model apart, across threads.

    * Forward passes (:meth:`enter_forward`, :meth:`exit_forward`) of any number of threads run side by side.
    * A switch (:meth:`switch`) waits until no forward pass runs, and forward passes that start meanwhile wait for
      it: otherwise a steady stream of requests would keep a switch waiting for ever.
    * :meth:`hold` keeps the size for one thread (a ``with model.budget(...)`` block, ``to_sliced``): switches of
      other threads wait until it ends; that thread may switch (nested budgets), and forward passes go on.
    * A switch from inside a forward pass of the same thread (a hook) raises: waiting for itself would never end,
      and not waiting would leave the blocks not yet run at the new size.

    A copy or an unpickled model gets a fresh gate: locks cannot be pickled, and a copy shares no modules.
    """

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._running = 0  # forward passes in progress, in all threads
        self._switching = False
        self._holder: int | None = None
        self._holds = 0
        self._local = threading.local()  # this thread's nesting depth of forward passes

    def __reduce__(self) -> tuple:
        return (type(self), ())

    def _depth(self) -> int:
        return getattr(self._local, "depth", 0)

    def enter_forward(self) -> None:
        """Start a forward pass; waits while a switch is under way or waiting. Pair with :meth:`exit_forward`.
        (Plain methods, not a context manager: torch.compile would try to trace a generator's frame.)"""
        depth = self._depth()
        if depth == 0:  # a nested call of a thread already inside must not wait behind a switch that waits for it
            with self._condition:
                while self._switching:
                    self._condition.wait()
                self._running += 1
        self._local.depth = depth + 1

    def exit_forward(self) -> None:
        """End the forward pass :meth:`enter_forward` started."""
        self._local.depth = depth = self._depth() - 1
        if depth == 0:
            with self._condition:
                self._running -= 1
                self._condition.notify_all()

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Keep the size for this thread: other threads' switches wait until the block ends."""
        if self._depth():  # inside a forward pass no switch can happen anyway, and waiting here could deadlock
            yield
            return
        me = threading.get_ident()
        with self._condition:
            while self._holder not in (None, me):
                self._condition.wait()
            self._holder, self._holds = me, self._holds + 1
        try:
            yield
        finally:
            with self._condition:
                self._holds -= 1
                if self._holds == 0:
                    self._holder = None
                    self._condition.notify_all()

    @contextlib.contextmanager
    def switch(self) -> Iterator[None]:
        """Around a change of widths: alone, with no forward pass running.

        Raises:
            BudgetError: called from inside a forward pass of this model in the same thread.
        """
        if self._depth():
            raise BudgetError("set_budget (or budget()) was called during a forward pass of this model, from a hook "
                              "or from the forward itself; the blocks still to run would compute at the new size. "
                              "Switch between forward passes.")
        with self.hold():
            with self._condition:
                self._switching = True
                try:
                    while self._running:
                        self._condition.wait()
                    yield  # the widths change here, with the condition's lock held: forwards cannot start
                finally:
                    self._switching = False
                    self._condition.notify_all()

"""Switchable models: one resident model that changes size between two forward passes.

``ElasticViTModel.from_pretrained(path, switchable=True)`` returns the stock transformers model with every unit of
the elastic checkpoint, in rank order, as an instance of its switchable twin ``hf_snapvit.loading.switchable.<StockClass>``
(the stock name, so ``config.architectures``, pipelines and pickle see the stock class, as with
:mod:`hf_snapvit.loading.sliced`). The twin adds :meth:`~SwitchableModelMixin.set_budget`, the
:meth:`~SwitchableModelMixin.budget` context manager, :attr:`~SwitchableModelMixin.elastic_budget` and saving at the
current size or whole. Each size is a prefix of every projection (:mod:`hf_snapvit.surgery.switching`), so a switch changes a
few integers per block and no weight. Calling the model (``model(...)``) and switching it go through the model's
:class:`~hf_snapvit.surgery.switching.SwitchGate`, so a switch from another thread waits for the forward passes under way.
"""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
import torch.nn as nn
from transformers import PreTrainedModel

from ..architectures import get_layers, get_spec
from ..architectures.budget import KeepCounts, ModelShape, budget_number, resolve_width_multiple
from ..errors import BudgetError, ConfigError
from ..utils.files import atomic_directory
from ..elastic.latency_file import LatencyTable, write_latency_file
from .latency_table import choose_table, device_name, dtype_name
from ..elastic.ranking import ElasticRanking
from ..elastic.records import warn_if_untrained
from ..elastic.remote_code import stock_class
from .sliced import finish_sliced, twin_class, twin_lookup
from ..surgery.slicing import slice_head_tables_
from ..elastic.file_names import PREFIX_FILE
from ..surgery.switching import (PrefixLinear, SwitchBlock, SwitchGate, capacity, install_corrections_, make_switchable_,
                        remove_head_prefixes_, set_widths_, switch_blocks)


@dataclass(frozen=True)
class ElasticBudget:
    """The size a switchable model computes at now.

    Args:
        heads, neurons: Heads and FFN neurons each block uses.
        sparsity: Fraction of the dense backbone's parameters left out.
        num_params: Backbone parameters in use.
        gflops: Theoretical GFLOPs of one image.
        width_multiple: The FFN width multiple the budget was resolved with.
        requested: What ``set_budget`` was asked (``{"sparsity": 0.3}``, ``{"latency_ms": 4.0, "batch_size": 8}``).
        predicted_latency_ms: For a latency budget, the latency the table predicts at this size.
    """

    heads: tuple[int, ...]
    neurons: tuple[int, ...]
    sparsity: float
    num_params: int
    gflops: float
    width_multiple: int | None
    requested: dict[str, Any] = field(default_factory=dict)
    predicted_latency_ms: float | None = None

    @classmethod
    def of(cls, counts: KeepCounts, width_multiple: int | None, requested: dict[str, Any],
           predicted_latency_ms: float | None = None) -> "ElasticBudget":
        """The budget of ``counts`` at ``width_multiple``, with what the caller asked for and the predicted latency."""
        return cls(tuple(counts.heads), tuple(counts.neurons), counts.sparsity, counts.num_params, counts.gflops,
                   width_multiple, dict(requested), predicted_latency_ms)

    def counts(self) -> KeepCounts:
        """The per-block keep counts of this size."""
        return KeepCounts(heads=list(self.heads), neurons=list(self.neurons), num_params=self.num_params,
                          gflops=self.gflops, sparsity=self.sparsity)


@dataclass
class _SwitchState:
    """What a switchable model carries besides its modules: the ranking, the dense shape, the current budget and the
    latency tables."""

    ranking: ElasticRanking
    shape: ModelShape
    current: ElasticBudget
    blocks: list[SwitchBlock]
    tables: list[LatencyTable] = field(default_factory=list)
    resolved: dict[tuple[Any, ...], KeepCounts] = field(default_factory=dict)
    correction: Any = None  # the checkpoint's prefix correction, applied at every size but the full one
    gate: SwitchGate = field(default_factory=SwitchGate, compare=False, repr=False)

    def resolve(self, multiple: int, **budget: Any) -> KeepCounts:
        """``ranking.keep_counts`` of one budget, remembered: a server switching among a few sizes resolves each
        once, and a switch then costs only the width changes."""
        key = (multiple, *sorted((k, v) for k, v in budget.items() if v is not None))
        counts = self.resolved.get(key)  # one lookup: another thread may clear the cache between two
        if counts is None:
            if len(self.resolved) >= 4096:  # a stream of ever-new latency targets must not grow without bound
                self.resolved.clear()
            counts = self.resolved[key] = self.ranking.keep_counts(**budget, width_multiple=multiple)
        return counts


def _gated_call(model: "SwitchableModelMixin", *args: Any, **kwargs: Any) -> Any:
    """``model(...)`` as a forward pass of the model's gate: a switch from another thread waits until it ends."""
    gate = model._switch_state().gate
    gate.enter_forward()
    try:
        return super(SwitchableModelMixin, model).__call__(*args, **kwargs)
    finally:
        gate.exit_forward()


# torch.compile runs this one frame eagerly and compiles the frames it calls (the stock forward): the lock stays out
# of the graph, with no graph break (fullgraph=True works).
_gated_call = torch.compiler.disable(_gated_call, recursive=False)
# New in torch 2.6 or 2.7; the disable wrappers of older versions did not refuse exports either.
_exporting = getattr(torch.compiler, "is_exporting", lambda: False)


class _GatedCall:
    """``__call__`` of switchable models: :func:`_gated_call`, bound to the model.

    A descriptor rather than a method because torch.export refuses to call a function that ``torch.compiler.disable``
    wraps; an export traces the plain ``nn.Module.__call__`` instead (it runs in one thread, and the exported graph
    has fixed widths anyway). A model without a ranking (a twin built by hand) has no gate, and is called plainly.
    """

    def __get__(self, model: Any, owner: type | None = None) -> Callable[..., Any] | "_GatedCall":
        if model is None:
            return self
        if _exporting() or "_elastic_switch" not in model.__dict__:
            return super(SwitchableModelMixin, model).__call__
        return types.MethodType(_gated_call, model)


class SwitchableModelMixin:
    """What a switchable class adds to its stock transformers class (see the module docstring)."""

    _elastic_switch: _SwitchState
    __call__ = _GatedCall()

    @classmethod
    def is_custom_code(cls) -> bool:
        """``False``: the modules and weight names are the stock class's."""
        return False

    def _switch_state(self) -> _SwitchState:
        state = self.__dict__.get("_elastic_switch")
        if state is None:
            raise ConfigError(f"This {type(self).__name__} has no elastic ranking attached; load it with "
                              "hf_snapvit.ElasticViTModel.from_pretrained(path, switchable=True).")
        return state

    @property
    def elastic_budget(self) -> ElasticBudget:
        """The current size: per-block heads and FFN widths, sparsity, parameters, GFLOPs, and what was asked."""
        return self._switch_state().current

    @property
    def elastic_latency_tables(self) -> list[LatencyTable]:
        """The latency tables ``set_budget(latency_ms=...)`` can use (loaded with the checkpoint or measured)."""
        return list(self._switch_state().tables)

    def add_latency_table(self, table: LatencyTable) -> None:
        """Keep ``table`` for latency budgets, replacing a table with the same device, dtype, batch and multiple."""
        if not isinstance(table, LatencyTable):
            raise ConfigError(f"add_latency_table takes a LatencyTable, got {type(table).__name__}.")
        state = self._switch_state()
        state.tables = [t for t in state.tables if t.key() != table.key()] + [table]

    def max_sparsity(self, width_multiple: int | None = None) -> float:
        """The largest sparsity the ranking's per-block floors allow at ``width_multiple``."""
        return self._switch_state().ranking.max_sparsity_for(width_multiple)

    def set_budget(self, sparsity: float | None = None, *, target_params: int | None = None,
                   target_gflops: float | None = None, latency_ms: float | None = None,
                   batch_size: int | None = None, width_multiple: int | None = None) -> ElasticBudget:
        """Switch the model to a budget, in place; no weight is copied, allocated or freed.

        Give exactly one of:
            sparsity: Fraction of the backbone's parameters to leave out (0 = the dense model).
            target_params: Backbone parameters to use.
            target_gflops: Theoretical GFLOPs of one image.
            latency_ms: The largest size whose latency, measured on this device in this dtype
                (:func:`hf_snapvit.measure_latency`, or ``elastic_latency.json`` beside the checkpoint), fits;
                interpolated between measured sizes. ``batch_size`` picks the table when several batch sizes were
                measured here.

        Resolution, floors and width alignment are those of ``ElasticViTModel.from_pretrained``
        (``width_multiple``: ``None`` = the default, 64 for ViT-S/B/L; ``1`` = exact widths).

        The switch waits for forward passes that other threads are running (and for another thread's
        ``with model.budget(...)`` block); forward passes that start meanwhile wait for the switch.

        Returns:
            The new :attr:`elastic_budget`.

        Raises:
            BudgetError: the budget is not a finite number, is out of range (the message gives the range), no
                latency table matches this device, dtype and batch size, or this is called from inside a forward
                pass of this model (a hook).
        """
        state = self._switch_state()
        requested = {k: v for k, v in (("sparsity", sparsity), ("target_params", target_params),
                                       ("target_gflops", target_gflops), ("latency_ms", latency_ms)) if v is not None}
        if len(requested) != 1:
            raise BudgetError(f"Give exactly one of sparsity, target_params, target_gflops or latency_ms; got "
                              f"{sorted(requested) or 'none'}.")
        for name, value in requested.items():
            budget_number(name, value)  # a finite real number, before it is used as a cache key
        if batch_size is not None and latency_ms is None:
            raise BudgetError("batch_size= only selects the latency table of a latency_ms budget.")
        multiple = resolve_width_multiple(width_multiple, state.shape.intermediate_size)
        if latency_ms is None:
            counts = state.resolve(multiple, sparsity=sparsity, target_params=target_params,
                                   target_gflops=target_gflops)
            return self._apply_budget(ElasticBudget.of(counts, multiple, requested))
        if latency_ms <= 0:
            raise BudgetError(f"latency_ms={latency_ms!r} must be positive (milliseconds per forward pass).")
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                       or batch_size < 1):
            raise BudgetError(f"batch_size={batch_size!r} must be a positive integer (the batch size a latency "
                              "table was measured at).")
        parameter = next(self.parameters())
        table = choose_table(state.tables, device_name(parameter.device), dtype_name(parameter.dtype), multiple,
                             batch_size)
        counts = self._fitting_size(table, latency_ms, multiple)
        requested["batch_size"] = table.batch_size
        return self._apply_budget(ElasticBudget.of(counts, multiple, requested, table.latency_at(counts.sparsity)))

    def _fitting_size(self, table: LatencyTable, latency_ms: float, multiple: int) -> KeepCounts:
        """The largest size whose predicted latency is at most ``latency_ms``. A budget resolves to the size
        *closest* to its sparsity, which can be one width group larger than the sparsity asked for; then step to
        smaller sizes until the prediction fits (the table's smallest size fits, or ``sparsity_for`` refused)."""
        state = self._switch_state()
        top = state.ranking.max_sparsity_for(multiple)
        sparsity = min(table.sparsity_for(latency_ms), top)
        counts, step = state.resolve(multiple, sparsity=sparsity), 1e-4
        while table.latency_at(counts.sparsity) > latency_ms and sparsity < top:
            sparsity, step = min(top, max(sparsity, counts.sparsity) + step), step * 2
            counts = state.resolve(multiple, sparsity=sparsity)
        return counts

    def _apply_budget(self, budget: ElasticBudget) -> ElasticBudget:
        state = self._switch_state()
        held_heads, held_neurons = state.shape.dense_heads, state.shape.dense_neurons
        if any(h > c for h, c in zip(budget.heads, held_heads)) or any(
                f > c for f, c in zip(budget.neurons, held_neurons)):
            raise BudgetError(f"The budget needs {list(budget.heads)} heads and {list(budget.neurons)} neurons per "
                              f"block, more than this model holds ({held_heads}, {held_neurons}).")
        with state.gate.switch():
            set_widths_(get_spec(self), state.blocks, budget.heads, budget.neurons)
            if state.correction is not None:
                install_corrections_(state.blocks, state.correction if state.correction.applies_at(budget.sparsity)
                                     else None)
            state.current = budget
        warn_if_untrained(self.config, budget.sparsity)
        return budget

    @contextlib.contextmanager
    def budget(self, sparsity: float | None = None, **kwargs: Any) -> Iterator[ElasticBudget]:
        """``with model.budget(sparsity=0.5): ...``: a temporary size (any :meth:`set_budget` arguments); the size
        before is restored on exit, also after an exception. The block keeps its size: other threads' switches wait
        until it ends (their forward passes run at this size meanwhile)."""
        with self._switch_state().gate.hold():
            previous = self.elastic_budget
            current = self.set_budget(sparsity, **kwargs)
            try:
                yield current
            finally:
                self._apply_budget(previous)

    def to_sliced(self) -> PreTrainedModel:
        """A standalone, physically sliced copy at the current size: what ``from_pretrained(path, sparsity=...)``
        returns for this budget. Only the kept prefixes are copied; the switchable model is not changed (another
        thread's switch waits until the copy is made)."""
        with self._switch_state().gate.hold():
            return self._sliced_copy()

    def _sliced_copy(self) -> PreTrainedModel:
        memo: dict[int, Any] = {id(self.__dict__["_elastic_switch"]): None}
        corrected = False
        for module in self.modules():
            if isinstance(module, PrefixLinear):
                active_weight, active_bias = module.active()
                fitted = module._buffers.get("corrected")
                weight = fitted if fitted is not None else active_weight.detach()
                memo[id(module.weight)] = nn.Parameter(weight.clone(), requires_grad=module.weight.requires_grad)
                if fitted is not None:
                    memo[id(fitted)] = None
                    corrected = True
                if module.bias is not None:
                    memo[id(module.bias)] = nn.Parameter(active_bias.detach().clone(),
                                                         requires_grad=module.bias.requires_grad)
        sliced = copy.deepcopy(self, memo)
        del sliced.__dict__["_elastic_switch"]
        for module in sliced.modules():
            if isinstance(module, PrefixLinear):
                module.__class__ = nn.Linear
                module._buffers.pop("corrected", None)
        remove_head_prefixes_(sliced)
        state = self._switch_state()
        spec = get_spec(sliced)
        for layer, heads in zip(get_layers(sliced, spec), state.current.heads):
            slice_head_tables_(layer, spec, range(heads))
        sliced.__class__ = stock_class(type(self))
        if corrected:
            sliced.config.elastic_correction = state.correction.record
        return finish_sliced(sliced, state.current.counts(), state.current.width_multiple, state.shape)

    def save_pretrained(self, save_directory: str | os.PathLike, *args: Any, whole: bool = False,
                        **kwargs: Any) -> None:
        """Save at the current size (``whole=False``, the default: the sliced checkpoint ``to_sliced()`` saves, with
        its card and loading module), or ``whole=True``: the elastic checkpoint (every unit in rank order, the
        ranking in ``config.json``) with the latency tables as ``elastic_latency.json``. At full size both are the
        elastic checkpoint. Other arguments are transformers' ``save_pretrained``'s."""
        sliced = self._sliced_unless(whole)
        if sliced is not None:
            return sliced.save_pretrained(save_directory, *args, **kwargs)
        if not kwargs.get("is_main_process", True) or kwargs.get("push_to_hub"):
            return super().save_pretrained(save_directory, *args, **kwargs)
        with atomic_directory(save_directory) as staging:
            super().save_pretrained(staging, *args, **kwargs)
            if self._switch_state().tables:
                write_latency_file(self._switch_state().tables, staging, merge=False)
            if self._switch_state().correction is not None:  # the factors of the weights just written
                shutil.copyfile(self._switch_state().correction.path, staging / PREFIX_FILE)
        return None

    def push_to_hub(self, repo_id: str, *args: Any, whole: bool = False, **kwargs: Any) -> Any:
        """transformers' ``push_to_hub`` of what :meth:`save_pretrained` saves: the current size (``whole=False``),
        or the elastic checkpoint."""
        sliced = self._sliced_unless(whole)
        if sliced is not None:
            return sliced.push_to_hub(repo_id, *args, **kwargs)
        return super().push_to_hub(repo_id, *args, **kwargs)

    def _sliced_unless(self, whole: bool) -> PreTrainedModel | None:
        """What a save at the current size writes: the sliced copy, or ``None`` for the elastic checkpoint (asked for,
        or at full size). The size is read and copied in one hold, so another thread cannot switch in between."""
        with self._switch_state().gate.hold():
            return None if whole or self.elastic_budget.sparsity == 0 else self._sliced_copy()


def switchable_class(stock: type) -> type:
    """The switchable twin of the transformers model class ``stock`` (``stock`` itself if it is one).

    Raises:
        TypeError: ``stock`` is not a model class that transformers exports.
    """
    return twin_class(stock, SwitchableModelMixin, __name__, "that switches size in place", exported_only=False)


def as_switchable(model: PreTrainedModel, ranking: ElasticRanking, shape: ModelShape,
                  tables: list[LatencyTable] | None = None, correction: Any = None) -> PreTrainedModel:
    """Make a dense ``model`` (every unit loaded, in the rank order of ``ranking``) switchable, in place, at full
    size. Only module classes change. ``correction``: a prefix correction (the checkpoint's
    :class:`~hf_snapvit.elastic.prefix_file.PrefixFile`) that every smaller size then computes with."""
    held = capacity(switch_blocks(model))
    if held != (shape.dense_heads, shape.dense_neurons):
        raise ConfigError(f"A switchable model needs every unit of the dense model; this one holds {held}.")
    blocks = make_switchable_(model)
    try:
        model.__class__ = switchable_class(stock_class(type(model)))
    except TypeError as error:
        raise ConfigError(f"{error} Switchable models are built from transformers' own classes.") from None
    dense = ranking.keep_counts(0.0, width_multiple=1)
    model.__dict__["_elastic_switch"] = _SwitchState(ranking, shape, ElasticBudget.of(dense, None, {}), blocks,
                                                     correction=correction)
    for table in tables or []:
        model.add_latency_table(table)
    return model


__getattr__ = twin_lookup(__name__, switchable_class)

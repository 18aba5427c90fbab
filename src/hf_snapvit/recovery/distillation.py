"""The recovery verbs, :func:`recover` (a trained copy) and :func:`recover_` (in place), and the loop of optimizer
steps they run; the wing's overview is :mod:`hf_snapvit.recovery`."""

from __future__ import annotations

import contextlib
import copy
import time
from typing import Any

import numpy as np
import torch
from huggingface_hub.utils import tqdm
from transformers import PreTrainedModel

from ..architectures import get_attention, get_layers, get_projection, get_spec
from ..architectures.embedding import input_size
from ..architectures.budget import layer_widths, model_shape
from ..data.calibration import sample_images
from ..utils.distributed import on_process_device, process_state, reduce_sum
from ..errors import RecoveryError
from ..elastic.ranking import ElasticRanking
from ..data.views import embedder, load_processor
from .config import RecoveryConfig, RecoverySummary
from .forward import forward_outputs, prefix_view
from .held_out import HeldOutCheck, held_out_record, held_out_sizes, skipped_record, split_held_out
from .parallel import Parallel, check_same_start
from .train import AugmentedBatches, TrainingState, make_optimizer

#: On an accelerator, step losses are read back (and shown) every this many steps.
LOSS_READ_EVERY = 25


def recover(
    model: PreTrainedModel,
    teacher: PreTrainedModel | None,
    data: Any,
    config: RecoveryConfig | None = None,
    *,
    processor: Any = None,
    show_progress: bool = True,
) -> tuple[PreTrainedModel, RecoverySummary]:
    """Distil ``model`` from ``teacher`` on unlabelled images and return the trained copy.

    Neither argument is modified: the student is a deep copy of ``model`` (use :func:`recover_` to train in place),
    and the teacher only runs forward passes under ``torch.no_grad``. Labels are never read.

    Args:
        model: The student: a model sliced from ``teacher`` (e.g. ``ElasticViTModel.from_pretrained(path,
            sparsity=0.5)``), or with ``config.elastic`` the dense elastic model itself
            (``ElasticViTModel.from_pretrained(path)``), whose ``config.elastic_ranking`` defines the prefixes.
        teacher: The dense model of the same architecture and hidden width. With ``config.elastic`` it may be
            ``None``: a frozen copy of ``model`` is then the teacher.
        data: Unlabelled images: PIL images, a ``datasets`` Dataset or streaming IterableDataset with an image
            column, or a ``[N, C, H, W]`` tensor of preprocessed pixel values.
        config: :class:`RecoveryConfig`; defaults when ``None``.
        processor: The image processor for PIL / dataset images; by default the teacher's checkpoint's own.
        show_progress: Show a progress bar with the loss.

    Returns:
        ``(student, summary)``: the trained copy in eval mode, with ``config.elastic_recovery`` recording the
        settings, the data and the losses, and the :class:`RecoverySummary`.
    """
    config = _check_config(config)
    student = copy.deepcopy(model)
    if teacher is None and config.elastic:
        teacher = model  # the caller's model is the frozen original: it only runs forward passes
    summary = recover_(student, teacher, data, config, processor=processor, show_progress=show_progress)
    return student, summary


def recover_(student: PreTrainedModel, teacher: PreTrainedModel | None, data: Any,
             config: RecoveryConfig | None = None, *, processor: Any = None,
             show_progress: bool = True) -> RecoverySummary:
    """:func:`recover`, training ``student`` in place (the teacher is still left as it is)."""
    config = _check_config(config)
    start_time = time.perf_counter()
    spec = get_spec(student)
    views = _check_pair(student, teacher, config)
    if teacher is None:
        teacher = copy.deepcopy(student)
    wanted = _num_images(data, config)
    drawn, _ = sample_images(data, wanted + config.held_out_images, seed=config.seed, model=teacher,
                             embed=embedder(teacher, processor))
    images, held, skipped = split_held_out(drawn, wanted, config)
    if processor is None and not isinstance(images, torch.Tensor):
        processor = load_processor(teacher, purpose="preprocess the recovery images")
    size = input_size(teacher.config)
    batches = AugmentedBatches(images, config, processor, size)
    check = HeldOutCheck(held, config, processor, size, held_out_sizes(views)) if held is not None else None
    was_training = teacher.training
    teacher.eval()
    student.eval()  # dropout off: the student is fitted to the teacher's deterministic function
    try:
        with contextlib.ExitStack() as stack:
            device = stack.enter_context(on_process_device(student))
            stack.enter_context(on_process_device(teacher))
            before = check.losses(student, teacher, spec, device) if check else None
            losses, resumed, processes = _train(student, teacher, spec, batches, config, views, device,
                                                show_progress)
            after = check.losses(student, teacher, spec, device) if check else None
    finally:
        teacher.train(was_training)
    record = held_out_record(check.sizes, before, after, len(held)) if check else skipped_record(skipped)
    summary = RecoverySummary(config, losses, len(images), _describe(data, len(images), config),
                              time.perf_counter() - start_time, resumed, [s for s, _ in views if s is not None],
                              record, processes)
    student.config.elastic_recovery = summary.to_dict()
    return summary


def _check_config(config: Any) -> RecoveryConfig:
    config = RecoveryConfig() if config is None else config
    if not isinstance(config, RecoveryConfig):
        raise RecoveryError(f"config must be a RecoveryConfig, got {type(config).__name__}.")
    return config


def _num_images(data: Any, config: RecoveryConfig) -> int:
    if config.num_images is not None:
        return config.num_images
    try:
        return int(data.shape[0]) if isinstance(data, torch.Tensor) else len(data)
    except TypeError:
        raise RecoveryError("RecoveryConfig(num_images=None) uses every image, which needs data with a length; "
                            "give num_images=N for a stream.") from None


def _describe(data: Any, num_images: int, config: RecoveryConfig) -> dict[str, Any]:
    """Where the images came from, as ``config.elastic_recovery["data"]`` records it."""
    return {"source": type(data).__name__, "name": getattr(getattr(data, "info", None), "dataset_name", None),
            "num_images": num_images, "seed": config.seed}


def _check_pair(student: PreTrainedModel, teacher: PreTrainedModel | None,
                config: RecoveryConfig) -> list[tuple[float | None, Any]]:
    """Check that ``student`` is a slice of ``teacher``; return the views to train: ``(sparsity, keep counts)``
    per view for elastic recovery, ``[(None, None)]`` otherwise."""
    if teacher is None and not config.elastic:
        raise RecoveryError("recover() needs the dense teacher: pass teacher=<the dense model> (or set "
                            "RecoveryConfig(elastic=True) to train a dense elastic model against its own copy).")
    if teacher is not None:
        # By name: a sliced model is an instance of hf_snapvit.loading.sliced's twin of its stock class (same name).
        if type(teacher).__name__ != type(student).__name__ or \
                get_spec(teacher).model_type != get_spec(student).model_type:
            raise RecoveryError(f"The teacher is a {type(teacher).__name__} and the student a "
                                f"{type(student).__name__}: recovery needs the dense model the student was sliced "
                                "from (same class).")
        # Read from the modules: a timm model's config names neither.
        for name, s, t in zip(("hidden width", "blocks"), _depth_and_width(student), _depth_and_width(teacher)):
            if s != t:
                raise RecoveryError(f"The student's {name} is {s} but the teacher's {t}: the student is not a "
                                    "slice of this teacher (slicing keeps both); pass its dense model.")
        (sh, sf), (th, tf) = layer_widths(student), layer_widths(teacher)
        wider = [l for l, (a, b, c, d) in enumerate(zip(sh, sf, th, tf)) if a > c or b > d]
        if wider:
            raise RecoveryError(f"The student is wider than the teacher in blocks {wider} (heads {sh} vs {th}, "
                                f"neurons {sf} vs {tf}): the teacher must be the dense model it was sliced from.")
    if not config.elastic:
        return [(None, None)]
    return _elastic_views(student, teacher, config)


def _depth_and_width(model: PreTrainedModel) -> tuple[int, int]:
    """The hidden width (what the first block's attention output projection gives) and the number of blocks."""
    spec = get_spec(model)
    layers = get_layers(model, spec)
    return get_projection(get_attention(layers[0], spec), spec.o_proj).out_features, len(layers)


def _elastic_views(student: PreTrainedModel, teacher: PreTrainedModel | None,
                   config: RecoveryConfig) -> list[tuple[float | None, Any]]:
    stored = getattr(student.config, "elastic_ranking", None)
    if stored is None or getattr(student.config, "elastic_layout", None):
        raise RecoveryError("Elastic recovery trains the dense elastic model: load it with "
                            "ElasticViTModel.from_pretrained(elastic_checkpoint) (no budget), so that it is dense "
                            "and carries config.elastic_ranking.")
    ranking = ElasticRanking.from_dict(stored)
    ranking.check_matches(model_shape(student))
    if not ranking.is_sorted():
        raise RecoveryError("The model's ranking is not in rank order, so its prefixes are not the ranked units; "
                            "load the model from the elastic checkpoint written by hf_snapvit.save_elastic.")
    if teacher is not None and layer_widths(teacher) != layer_widths(student):
        raise RecoveryError("Elastic recovery needs the dense teacher (the same widths as the dense student).")
    low, high = config.elastic_range
    high = min(high, ranking.max_sparsity_for(None))
    if low > high:
        raise RecoveryError(f"elastic_range={list(config.elastic_range)} starts above the ranking's maximum "
                            f"sparsity {high:.4f}; lower it.")
    return [(s, ranking) for s in (low, high)]


def _step_views(views: list[tuple[float | None, Any]], config: RecoveryConfig,
                step: int) -> list[tuple[float | None, Any]]:
    """This step's views: the fixed ends, plus ``elastic_samples`` sparsities drawn (seeded) in between."""
    if views[0][0] is None:
        return [(None, None)]
    (low, ranking), (high, _) = views
    drawn = np.random.default_rng([config.seed, 3, step]).uniform(low, high, config.elastic_samples)
    return [(float(s), ranking.keep_counts(float(s))) for s in (low, high, *sorted(drawn))]


def _autocast(device: torch.device, config: RecoveryConfig) -> contextlib.AbstractContextManager:
    bf16 = config.mixed_precision == "bf16" or (config.mixed_precision == "auto" and device.type == "cuda")
    return torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()


def _train(student, teacher, spec, batches: AugmentedBatches, config: RecoveryConfig, views, device,
           show_progress: bool) -> tuple[list[float], int, dict[str, Any]]:
    """Run the optimizer steps (from a saved state, if there is one); return the losses, the step resumed at and how
    the processes shared the work (:meth:`Parallel.describe`)."""
    state = process_state()
    teacher_device = next(teacher.parameters()).device
    optimizer, scheduler = make_optimizer(student, config)
    saver = TrainingState(config)
    start, losses = saver.load(student, optimizer, scheduler)
    check_same_start(start, saver.path)
    parallel = Parallel(student, spec, config, optimizer, scheduler)  # after loading: DDP starts from these weights
    bar = tqdm(range(start, config.steps), desc="recovery", initial=start, total=config.steps,
               disable=not show_progress or not state.is_main_process)
    pending: list[torch.Tensor] = []  # step losses still on the device: reading each one would stall the queue

    def settle() -> None:
        losses.extend(float(loss) for loss in pending)
        pending.clear()
        if losses:
            bar.set_postfix(loss=f"{losses[-1]:.4f}")

    try:
        for step in bar:
            parallel.optimizer.zero_grad(set_to_none=True)
            pixels = batches.share(step, state.process_index, state.num_processes,
                                   None if device.type == "cpu" else device).to(device)
            with torch.no_grad(), _autocast(teacher_device, config):  # the teacher may live elsewhere
                target = forward_outputs(teacher, spec, pixels.to(teacher_device)).to(device)
            chosen = _step_views(views, config, step)
            total = torch.zeros((), dtype=torch.float32 if device.type == "mps" else torch.float64, device=device)
            for i, (_, counts) in enumerate(chosen):
                view = prefix_view(student, spec, counts.heads, counts.neurons) if counts is not None \
                    else contextlib.nullcontext()
                with parallel.accumulating(last=i + 1 == len(chosen)):
                    with view, _autocast(device, config):
                        loss = parallel.loss(pixels, target, config.batch_size * len(chosen))
                    parallel.backward(loss)
                total += loss.detach().double()
            parallel.optimizer.step()
            parallel.scheduler.step()
            pending.append(reduce_sum([total])[0])
            if device.type == "cpu" or len(pending) >= LOSS_READ_EVERY:
                settle()
            if config.checkpoint_every and ((step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps):
                settle()
                saver.save(step + 1, student, optimizer, scheduler, losses)  # DDP trains the student in place
        processes = parallel.describe()
    finally:
        parallel.close()
    settle()
    return losses, start, processes


__all__ = ["recover", "recover_"]

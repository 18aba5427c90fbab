"""Recovery on N processes through accelerate: the student wrapped by ``Accelerator.prepare``, gradients reduced by it.

Under ``accelerate launch`` the student (inside :class:`Distilled`, whose forward ends at the loss), its AdamW and its
schedule go through ``Accelerator.prepare``, which wraps it in DDP on GPUs or on CPU processes (gloo). The wrapper
reduces the gradients during ``backward``; nothing here sums them. Sharded training (FSDP, DeepSpeed) is refused
with an error for now: each process holds the whole student, its AdamW state and the teacher.

DDP averages the processes' gradients, while one step of recovery is the *sum* of its images' gradients divided by
the global batch size: each process's loss is multiplied by the number of processes before ``backward``, so the
average of the N scaled gradients is the one-process gradient up to the order of float additions. The shares of a
batch may be unequal (7 images on 2 processes: 4 and 3); the global divisor keeps them exact.

On one process nothing is prepared (accelerate would hand the same objects back) and no ``AcceleratorState`` is
created, so a caller can still build its own ``Accelerator(mixed_precision=...)`` afterwards.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
import torch.nn as nn

from ..architectures import ArchitectureSpec
from ..utils.distributed import process_state
from ..errors import RecoveryError
from .config import RecoveryConfig
from .forward import Outputs, forward_outputs, per_image_loss


#: accelerate's distributed types whose ``prepare`` wraps the student in DDP.
DATA_PARALLEL = ("MULTI_CPU", "MULTI_GPU", "MULTI_XPU", "MULTI_NPU", "MULTI_MLU", "MULTI_MUSA", "MULTI_SDAA",
                 "MULTI_HPU")


class Distilled(nn.Module):
    """The student with the distillation loss as its forward: ``[b]`` per-image losses against the teacher's outputs.

    The data-parallel wrapper follows the graph from what its forward returns; ending it at the loss means a
    distillation term weighted 0 (no logits, say) leaves no parameter waiting for a gradient that never comes.
    """

    def __init__(self, student: nn.Module, spec: ArchitectureSpec, config: RecoveryConfig) -> None:
        super().__init__()
        self.student, self.spec, self.config = student, spec, config
        self.train(student.training)

    def forward(self, pixels: torch.Tensor, hidden: list[torch.Tensor], embedding: torch.Tensor,
                logits: torch.Tensor | None) -> torch.Tensor:
        """Per-image losses of the student on ``pixels`` against the teacher's ``hidden``, ``embedding`` and
        ``logits``."""
        out = forward_outputs(self.student, self.spec, pixels)
        return per_image_loss(out, Outputs(hidden, embedding, logits), self.config)


class Parallel:
    """The distilled student, optimizer and schedule of one run, prepared by accelerate when there are N processes.

    Args:
        student: The student, on this process's device.
        spec: Its architecture.
        config: The recovery settings.
        optimizer: AdamW over the student's trainable parameters (already restored when resuming).
        scheduler: Its learning-rate schedule.
    """

    def __init__(self, student: nn.Module, spec: ArchitectureSpec, config: RecoveryConfig,
                 optimizer: torch.optim.Optimizer, scheduler: Any) -> None:
        state = process_state()
        if config.batch_size < state.num_processes:
            raise RecoveryError(f"RecoveryConfig(batch_size={config.batch_size}) on {state.num_processes} processes "
                                "leaves some processes without an image of a batch; use batch_size >= "
                                f"{state.num_processes} (it counts the images of a step over all processes).")
        self.num_processes = state.num_processes
        self.module: nn.Module = Distilled(student, spec, config)
        self.optimizer, self.scheduler = optimizer, scheduler
        self.accelerator = None
        if state.num_processes > 1:
            self.accelerator = _accelerator()
            kind = self.accelerator.distributed_type.value
            if kind not in DATA_PARALLEL:
                raise RecoveryError(f"Recovery runs on several processes through DDP (accelerate's {DATA_PARALLEL}); "
                                    f"this launch asks for {kind}, which it does not support yet. Launch without "
                                    "--use_fsdp / DeepSpeed (accelerate config), or on one process.")
            self.module, self.optimizer, self.scheduler = self.accelerator.prepare(self.module, optimizer, scheduler)
        self.wrapper = type(self.module).__name__

    def describe(self) -> dict[str, Any]:
        """What ``config.elastic_recovery["processes"]`` records: the number of processes, accelerate's distributed
        type and the class that held the student (``Distilled`` on one process, ``DistributedDataParallel`` on
        N)."""
        kind = "NO" if self.accelerator is None else str(self.accelerator.distributed_type.value)
        return {"num_processes": self.num_processes, "distributed_type": kind, "wrapper": self.wrapper}

    def loss(self, pixels: torch.Tensor, target: Outputs, divisor: int) -> torch.Tensor:
        """The student's loss on ``pixels``: the per-image losses summed and divided by ``divisor`` (the global number
        of image-views of the step); what :meth:`backward` takes."""
        return self.module(pixels, target.hidden, target.embedding, target.logits).sum() / divisor

    @contextlib.contextmanager
    def accumulating(self, last: bool) -> Iterator[None]:
        """Around one view's forward and backward: gradients are reduced across processes only at the ``last`` view
        of a step (``no_sync`` before it), so a step of several views costs one reduction."""
        if self.accelerator is None or last:
            yield
            return
        with self.accelerator.no_sync(self.module):
            yield

    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate this process's ``loss`` of a step (scaled so that DDP's average is the global sum)."""
        if self.accelerator is None:
            loss.backward()
        else:
            self.accelerator.backward(loss * self.num_processes)

    def close(self) -> None:
        """Drop accelerate's references to the wrapper (its hooks on the student's gradients go with it)."""
        if self.accelerator is not None:
            self.accelerator.free_memory()
        self.module = self.optimizer = self.scheduler = None


def check_same_start(step: int, where: Any) -> None:
    """Raise on every process unless all of them resume at ``step``: a process that did not see the saved state
    (``where``, on a disk of its own machine) would run other steps and leave the others waiting in a collective."""
    state = process_state()
    if state.num_processes == 1:
        return
    from accelerate.utils import gather_object

    steps = gather_object([step])
    if len(set(steps)) > 1:
        raise RecoveryError(f"The processes would resume recovery at different steps {steps} (process index order): "
                            f"not every process sees the same saved state {str(where)!r}. Put output_dir on a file "
                            "system that every machine of the launch shares, or delete the state to start over.")


def _accelerator() -> Any:
    from accelerate import Accelerator, DataLoaderConfiguration
    from accelerate.utils import AutocastKwargs, DistributedDataParallelKwargs

    # split_batches: batch_size is over all processes, so the prepared schedule steps once per step (not N times);
    # autocast off: RecoveryConfig.mixed_precision decides the precision, as on one process; no buffer broadcast: the
    # student runs in eval mode and changes none; find_unused_parameters: a model's unused pooler gets no gradient.
    return Accelerator(dataloader_config=DataLoaderConfiguration(split_batches=True),
                       kwargs_handlers=[AutocastKwargs(enabled=False),
                                        DistributedDataParallelKwargs(find_unused_parameters=True,
                                                                      broadcast_buffers=False)])

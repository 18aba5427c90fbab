"""The distillation loop's parts: seeded augmented batches, the optimizer and schedule, resuming.

Every random choice is a function of ``(seed, step, position in the batch)``: which image (epochs of a seeded
permutation), its crop and its flip. A process therefore builds only its own share of a batch (positions
``rank, rank + N, ...``) and N processes see exactly the images one process sees; each image's loss is divided by
the global batch size and accelerate's data-parallel wrapper reduces the gradients
(:mod:`hf_snapvit.recovery.parallel`), so one optimizer step is the same computation on 1 or N processes up to the
order of float additions. The only state is the step counter, the weights, AdamW's moments and the schedule, which
:class:`TrainingState` saves.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn as nn

from ..utils.distributed import process_state
from ..errors import RecoveryError
from ..utils.files import atomic_file, remove_torn_writes
from ..data.views import MultiCropConfig, Normalizer, image_tensor, multi_crops
from .config import RecoveryConfig

STATE_FILE = "recovery_state.pt"


#: Bytes of decoded images :class:`AugmentedBatches` keeps on an accelerator (decoding and uploading each image at
#: every use would cost more than the training step of a small model).
DEVICE_CACHE_BYTES = 2 * 1024**3


class AugmentedBatches:
    """The seeded, augmented batches of a recovery run, built one process share at a time."""

    def __init__(self, images: Any, config: RecoveryConfig, processor: Any, size: int) -> None:
        self.images, self.config, self.size = images, config, size
        self.normalizer = None if isinstance(images, torch.Tensor) else Normalizer(processor)
        self.crops = MultiCropConfig(num_global=1, num_local=0, global_scale=tuple(config.crop_scale),
                                     global_size=size)
        self._orders: dict[int, np.ndarray] = {}
        self._on_device: dict[int, torch.Tensor] = {}
        self._cached_bytes = 0

    def _image(self, position: int, device: torch.device | None) -> Any:
        count = len(self.images)
        epoch = position // count
        if epoch not in self._orders:
            self._orders = {epoch: np.random.default_rng([self.config.seed, 1, epoch]).permutation(count)}
        index = int(self._orders[epoch][position % count])
        if device is None:
            return self.images[index]
        if index in self._on_device:
            return self._on_device[index]
        image = self.images[index]
        image = image.to(device) if isinstance(image, torch.Tensor) else image_tensor(image, device)
        if self._cached_bytes + image.nbytes <= DEVICE_CACHE_BYTES:
            self._on_device[index] = image
            self._cached_bytes += image.nbytes
        return image

    def share(self, step: int, rank: int, world_size: int, device: torch.device | None = None
              ) -> torch.Tensor | None:
        """``[b, C, S, S]`` pixels of this process's positions of batch ``step`` (``None`` if it has none), made on
        ``device`` when one is given (callers give an accelerator; the images are then decoded once and kept there)."""
        crops = []
        for j in range(rank, self.config.batch_size, world_size):
            position = step * self.config.batch_size + j
            rng = np.random.default_rng([self.config.seed, 2, step, j])
            crop, _ = multi_crops([self._image(position, device)], self.crops, self.normalizer, self.size, rng,
                                  device)
            crop = crop[0, 0]
            if rng.random() < self.config.flip:
                crop = crop.flip(-1)
            crops.append(crop)
        return torch.stack(crops) if crops else None


def lr_factor(config: RecoveryConfig) -> Callable[[int], float]:
    """Linear warm-up to ``lr``, then cosine decay to ``min_lr_ratio · lr`` at the last step."""
    def factor(step: int) -> float:
        if step < config.warmup_steps:
            return (step + 1) / (config.warmup_steps + 1)
        span = max(config.steps - config.warmup_steps - 1, 1)
        progress = min((step - config.warmup_steps) / span, 1.0)
        return config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return factor


def make_optimizer(model: nn.Module, config: RecoveryConfig) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW over every trainable parameter, with the warm-up + cosine schedule."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise RecoveryError("The student has no trainable parameters (requires_grad is False everywhere); "
                            "call student.requires_grad_(True) first.")
    # The fused kernel on CUDA: a small student's step is otherwise dominated by the optimizer's many launches.
    fused = all(p.is_cuda and p.dtype == torch.float32 for p in params)
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay, fused=fused or None)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(config))


class TrainingState:
    """Saves and restores a run's weights, optimizer, schedule, step and losses in ``output_dir``."""

    def __init__(self, config: RecoveryConfig) -> None:
        self.config = config
        self.path = Path(config.output_dir) / STATE_FILE if config.output_dir is not None else None

    def save(self, step: int, model: nn.Module, optimizer: Any, scheduler: Any, losses: list[float]) -> None:
        """Write the state after ``step`` steps (main process only; atomic, so an interrupted save keeps the old)."""
        state = process_state()
        if self.path is not None and state.is_main_process:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            remove_torn_writes(self.path)  # a run killed mid-write left them
            payload = {"step": step, "key": self.config.training_key(), "model": model.state_dict(),
                       "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                       "losses": list(losses), "torch_rng": torch.get_rng_state()}
            with atomic_file(self.path, "wb") as handle:
                torch.save(payload, handle)
        state.wait_for_everyone()

    def load(self, model: nn.Module, optimizer: Any, scheduler: Any) -> tuple[int, list[float]]:
        """Restore a saved state into the objects; ``(0, [])`` when there is none."""
        if self.path is None or not self.path.exists():
            return 0, []
        try:
            saved = torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception as error:
            raise RecoveryError(f"The recovery state {str(self.path)!r} cannot be read ({error}); delete it to "
                                "start over.") from error
        if saved.get("key") != self.config.training_key():
            changed = sorted(k for k in self.config.training_key() if saved.get("key", {}).get(k) !=
                             self.config.training_key()[k])
            raise RecoveryError(f"{str(self.path)!r} holds a run with other settings ({changed} differ), so it "
                                "cannot be resumed; use another output_dir or the same settings.")
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        torch.set_rng_state(saved["torch_rng"])
        return int(saved["step"]), [float(x) for x in saved["losses"]]

    def __repr__(self) -> str:
        return f"TrainingState({os.fspath(self.path) if self.path else None})"

"""Settings and report of a label-free recovery (distillation of a sliced model from its dense teacher)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import RecoveryError
from ..utils.validation import Settings


@dataclass(frozen=True)
class RecoveryConfig(Settings):
    """Settings of :func:`hf_snapvit.recover`.

    The defaults are a starting point, not a measured optimum: ``benchmarks/recovery_vit_tiny.py`` varies them.

    Args:
        steps: Optimizer steps (>= 1).
        batch_size: Images per step, over all processes (>= 1).
        num_images: Unlabelled images drawn (seeded) from the data and cycled through with augmentation; ``None``
            uses every image given (needs data with a length).
        lr: Peak AdamW learning rate.
        weight_decay: AdamW weight decay.
        warmup_steps: Linear warm-up steps, then a cosine decay to ``min_lr_ratio · lr`` at the last step.
        min_lr_ratio: Final learning rate as a fraction of ``lr``.
        hidden_weight: Weight of the hidden-state loss: each block's output, MSE relative to the teacher's mean
            square, averaged over blocks (scale-free, so one weight fits every model).
        embedding_weight: Weight of the image-embedding loss (the backbone's pooled/CLS embedding, relative MSE).
        logits_weight: Weight of the KL divergence of the logits (models with a classification head only).
        temperature: Softmax temperature of the logits KL (the loss is scaled by ``temperature²``).
        crop_scale: Area fractions of the random resized crop; ``(1.0, 1.0)`` turns cropping off.
        flip: Probability of a horizontal flip.
        mixed_precision: ``"auto"``: bf16 autocast on CUDA, float32 elsewhere; ``"bf16"`` or ``"no"`` to force.
        seed: Seeds the image draw, the batches and the augmentation: the same seed gives the same weights.
        elastic: Train the dense elastic model itself so that every prefix (every sparsity) improves; see
            :func:`hf_snapvit.recover`.
        elastic_range: ``(lowest, highest)`` sparsity of the sliced views of elastic recovery; the highest is capped
            at the ranking's maximum.
        elastic_samples: Sliced views per step besides the two ends of the range (the sandwich rule trains the
            largest and the smallest every step, plus this many drawn uniformly in between).
        held_out_images: Images of the seeded draw never trained on: each checked size's loss is measured on them
            before and after training, and sizes that got worse are reported (``config.elastic_recovery
            ["held_out"]``) with a warning. Taken beyond ``num_images`` when the data has them, else off the end of
            the draw; ``0`` turns the check off.
        checkpoint_every: Save the training state every this many steps to ``output_dir`` (``None``: never).
        output_dir: Folder of the training state; a run finding a state there resumes from it.
    """

    steps: int = 300
    batch_size: int = 64
    num_images: int | None = 4000
    lr: float = 3e-4
    weight_decay: float = 0.01
    warmup_steps: int = 10
    min_lr_ratio: float = 0.0
    hidden_weight: float = 1.0
    embedding_weight: float = 1.0
    logits_weight: float = 1.0
    temperature: float = 1.0
    crop_scale: tuple[float, float] = (0.5, 1.0)
    flip: float = 0.5
    mixed_precision: str = "auto"
    seed: int = 0
    elastic: bool = False
    elastic_range: tuple[float, float] = (0.0, 0.6)
    elastic_samples: int = 1
    held_out_images: int = 64
    checkpoint_every: int | None = None
    output_dir: str | None = None

    error_class = RecoveryError

    def __post_init__(self) -> None:
        for name, minimum in (("steps", 1), ("batch_size", 1), ("warmup_steps", 0), ("elastic_samples", 0),
                              ("held_out_images", 0)):
            self._check_int(name, minimum)
        self._check_int("num_images", 1, optional=True)  # None: every image given
        self._check_real("lr", 0, low_open=True)
        self._check_real("temperature", 0, low_open=True)
        for name in ("weight_decay", "hidden_weight", "embedding_weight", "logits_weight"):
            self._check_real(name, 0)
        self._check_real("min_lr_ratio", 0, 1)
        self._check_real("flip", 0, 1, hint="the flip probability")
        if self.hidden_weight + self.embedding_weight + self.logits_weight == 0:
            raise RecoveryError("RecoveryConfig: hidden_weight, embedding_weight and logits_weight are all 0, so "
                                "there is nothing to distil; give at least one a positive weight.")
        self._check_pair("crop_scale", low_open=True, hint="(0.5, 1.0)")
        self._check_pair("elastic_range", low_open=False, hint="(0.0, 0.6)")
        self._check_choice("mixed_precision", ("auto", "bf16", "no"))
        self._check_bool("elastic")
        self._check_int("checkpoint_every", 1, optional=True)
        if self.checkpoint_every is not None and self.output_dir is None:
            raise RecoveryError("RecoveryConfig(checkpoint_every=...) needs output_dir=FOLDER to save the "
                                "training state in.")

    def training_key(self) -> dict[str, Any]:
        """The settings that determine the weights (a resumed run must match them); the checkpointing is not one."""
        return {k: v for k, v in self.to_dict().items() if k not in ("checkpoint_every", "output_dir")}


@dataclass
class RecoverySummary:
    """What :func:`hf_snapvit.recover` did: the losses per step, where the images came from, each checked size's
    loss on held-out images before and after (``held_out``, see :mod:`hf_snapvit.recovery.held_out`) and how many
    processes trained it through which wrapper (``processes``, see :mod:`hf_snapvit.recovery.parallel`)."""

    config: RecoveryConfig
    losses: list[float]
    num_images: int
    data: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    resumed_from: int = 0
    sparsities: list[float] = field(default_factory=list)
    held_out: dict[str, Any] = field(default_factory=dict)
    processes: dict[str, Any] = field(default_factory=dict)

    def final_loss(self, window: int = 10) -> float:
        """Mean loss of the last ``window`` steps."""
        tail = self.losses[-window:]
        return float(sum(tail) / len(tail)) if tail else float("nan")

    def to_dict(self) -> dict[str, Any]:
        """What ``config.elastic_recovery`` records: settings, data description, steps and losses."""
        return {"settings": self.config.to_dict(), "data": self.data, "num_images": self.num_images,
                "steps": len(self.losses), "first_loss": round(self.losses[0], 6) if self.losses else None,
                "final_loss": round(self.final_loss(), 6), "seconds": round(self.seconds, 3),
                "elastic": self.config.elastic, "sparsities": self.sparsities, "held_out": self.held_out,
                "processes": self.processes}

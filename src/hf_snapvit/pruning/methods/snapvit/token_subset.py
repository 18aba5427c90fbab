"""A fixed random share of each image's patch tokens for the search's forwards
(``SnapViTConfig.fitness_token_fraction``).

The search only compares candidates with the dense teacher, so both may see the same part of each image: the blocks
then process fewer tokens and a forward costs about that share of a full one. Each image keeps its own subset, drawn
from the seed and the image's index, so the teacher and every candidate see the same tokens of it. The tokens
before the patches (CLS, registers, distillation) are always kept; patches keep their own position embeddings, so
what the blocks see is part of an ordinary input, not a resized one.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn

from ....errors import ConfigError


class TokenSubset:
    """Each image's kept tokens: the leading non-patch tokens and a fixed random share of its patch tokens. Inside
    :meth:`on`, a block sees of each image of :attr:`images` only those; every later block follows from it.

    Args:
        extra_tokens: Leading non-patch tokens (always kept).
        fraction: Share of the patch tokens kept, in (0, 1].
        seed: Seeds each image's subset (with the image's index).
        model_type: Named in errors.
    """

    def __init__(self, extra_tokens: int, fraction: float, seed: int, model_type: str) -> None:
        self.extra, self.fraction, self.seed, self.model_type = extra_tokens, fraction, seed, model_type
        self.images: range = range(0)  # the images of the next forward, by index
        # A batch's token indices, built once per (images, tokens, device): a search forwards the same batches for
        # every candidate, and on an accelerator the indices then stay there instead of being copied each forward.
        self._batches: dict[tuple[range, int, torch.device], torch.Tensor] = {}

    def kept(self, image: int, tokens: int) -> torch.Tensor:
        """Sorted indices of the tokens image ``image`` keeps of ``tokens``."""
        patches = tokens - self.extra
        count = max(1, round(self.fraction * patches))
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + image)
        chosen = torch.randperm(patches, generator=generator)[:count].sort().values + self.extra
        return torch.cat([torch.arange(self.extra), chosen])

    def _index(self, tokens: int, device: torch.device) -> torch.Tensor:
        key = (self.images, tokens, device)
        if key not in self._batches:
            self._batches[key] = torch.stack([self.kept(i, tokens) for i in self.images]).to(device)
        return self._batches[key]

    def _hook(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        hidden = args[0] if args else kwargs["hidden_states"]
        batch, tokens = hidden.shape[:2]
        others = [*args[1:], *kwargs.values()] if args else [v for k, v in kwargs.items() if k != "hidden_states"]
        others = [t for v in others for t in (v if isinstance(v, (tuple, list)) else (v,))]
        if any(isinstance(v, torch.Tensor) and tokens in v.shape[-2:] for v in others):
            raise ConfigError(f"fitness_token_fraction={self.fraction} cannot be used with {self.model_type!r}: its "
                              "blocks take per-token inputs beside the hidden states (an attention mask or rotary "
                              "position embeddings). Leave fitness_token_fraction at 1.0 for this model.")
        if len(self.images) != batch:
            raise RuntimeError(f"TokenSubset was told of {len(self.images)} images for a batch of {batch}.")
        index = self._index(tokens, hidden.device)
        kept = hidden.gather(1, index[..., None].expand(-1, -1, hidden.shape[-1]))
        return ((kept, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": kept})

    @contextmanager
    def on(self, layer: nn.Module) -> Iterator["TokenSubset"]:
        """Give ``layer`` (a model's first block) only the kept tokens while inside ``with``."""
        handle = layer.register_forward_pre_hook(self._hook, with_kwargs=True)
        try:
            yield self
        finally:
            handle.remove()

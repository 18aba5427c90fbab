"""An SDPA attention implementation for compiled serving: the stock kernels, without a mask that masks nothing.

Inside ``torch.compile`` on torch 2.11, ``torch.compiler.is_exporting()`` answers True (torch 2.13 answers False), so
transformers' bidirectional mask builder never takes its "nothing is masked" shortcut and materialises an all-true
boolean mask. No fused SDPA kernel takes that mask (flash takes none; cuDNN and memory-efficient attention refuse a
197-wide boolean one), so every attention of a compiled ViT runs PyTorch's math path, which computes bf16 attention
in float32 on CUDA cores: a compiled dense ViT-B/16 ran twice as slow as eager on an H200
(``benchmarks/results/serving_paths/*``, docs/deployment.md).

:data:`UNPADDED_SDPA` names transformers' own SDPA attention function with a mask builder that returns no mask when
no padding mask is given and the attention is plain bidirectional (exactly the stock builder's shortcut, taken under
tracing too), and builds transformers' SDPA mask in every other case. Select it like any attention implementation:
``ElasticViTModel.from_pretrained(path, sparsity=0.3, attn_implementation=UNPADDED_SDPA)`` or
``model.set_attn_implementation(UNPADDED_SDPA)``. Outputs equal the ``"sdpa"`` implementation's.
"""

from __future__ import annotations

from typing import Any

from transformers import AttentionInterface, AttentionMaskInterface

UNPADDED_SDPA = "sdpa_unpadded"
# transformers' own SDPA attention function and mask builder, taken from its public interfaces at import, before
# anything could re-register "sdpa" (their modules, transformers.integrations.sdpa_attention and
# transformers.masking_utils, are not part of transformers' public API).
_SDPA_ATTENTION = AttentionInterface()["sdpa"]
_SDPA_MASK = AttentionMaskInterface()["sdpa"]


def unpadded_sdpa_mask(*args: Any, **kwargs: Any) -> Any:
    """transformers' SDPA mask, or ``None`` where it would mask nothing: no padding mask, plain bidirectional
    attention (the caller allows the bidirectional shortcut), no local window."""
    if (kwargs.get("attention_mask") is None and kwargs.get("allow_is_bidirectional_skip")
            and kwargs.get("local_size") is None):
        return None
    return _SDPA_MASK(*args, **kwargs)


def register_unpadded_sdpa() -> str:
    """Register :data:`UNPADDED_SDPA` with transformers' attention and mask interfaces (idempotent); its name."""
    AttentionInterface.register(UNPADDED_SDPA, _SDPA_ATTENTION)
    AttentionMaskInterface.register(UNPADDED_SDPA, unpadded_sdpa_mask)
    return UNPADDED_SDPA

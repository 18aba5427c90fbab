"""The modules zoo models are made of (tests/support/zoo.py): an attention, an FFN and a block with every option the
hostile zoo needs (tests/support/zoo_cases.py), each read from a plain dict of options, and two blocks that are not
transformer blocks at all."""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

ATTENTION = dict(names=("q", "k", "v", "o"), fused=False, bias=(True, True, True, True), heads=4, head_dim=None,
                 kv_heads=None, count_attr="num_heads", width_attr="head_dim", size_attr=None, split="width_attr",
                 merge="flat", impl="sdpa", talking=None, gate=False, temperature=False, head_bias=False, table=False,
                 qk_norm=None, memory=0, order=(0, 1, 2))
FFN = dict(kind="plain", names=("fc1", "fc2"), bias=(True, True), act="gelu", width=48, norm=None, sequential=False)
BLOCK = dict(attn_name="attn", ffn_name="mlp", norm="pre", norm_kind="layer", parallel=False, layer_scale=False,
             ffn_twice=False, attn_twice=False)


def merge(base: dict, *overrides: dict) -> dict:
    """``base`` updated by each override; nested dicts (``attn``, ``ffn``, ``block``) are merged, not replaced."""
    out = copy.deepcopy(base)
    for override in overrides:
        for key, value in (override or {}).items():
            out[key] = merge(out[key], value) if isinstance(out.get(key), dict) and isinstance(value, dict) else value
    return out



class QuickGELU(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(1.702 * x)


ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU, "silu": nn.SiLU, "tanh": nn.Tanh, "quick_gelu": QuickGELU}


class WidthFreeNorm(nn.Module):  # a LayerNorm without weights: it runs at any width, with other statistics
    def forward(self, x):
        return F.layer_norm(x, x.shape[-1:])


def _norm(kind: str, width: int) -> nn.Module:
    return {"rms": nn.RMSNorm, "free": lambda _: WidthFreeNorm()}.get(kind, nn.LayerNorm)(width)


class ZooAttention(nn.Module):
    """Multi-head attention with every option of :data:`ATTENTION`; ``opts`` (not an int attribute) keeps the dense
    sizes, so only the attributes named ``count_attr``/``width_attr``/``size_attr`` tell slicing about heads."""

    def __init__(self, a: dict, width: int, tokens: int):
        super().__init__()
        heads, hd = a["heads"], a["head_dim"] or width // a["heads"]
        kv = a["kv_heads"] or heads
        self.opts = dict(a, hd=hd, heads=heads, kv=kv)
        q, k, v, o = a["names"]
        if a["fused"]:
            setattr(self, q, nn.Linear(width, 3 * heads * hd, bias=a["bias"][0]))
        else:
            for name, rows, bias in ((q, heads, a["bias"][0]), (k, kv, a["bias"][1]), (v, kv, a["bias"][2])):
                setattr(self, name, nn.Linear(width, rows * hd, bias=bias))
        setattr(self, o, nn.Linear(heads * hd, width, bias=a["bias"][3]))
        for attr, value in ((a["count_attr"], heads), (a["width_attr"], hd), (a["size_attr"], heads * hd)):
            if attr:
                setattr(self, attr, value)
        if a["talking"]:
            self.mix = nn.Parameter(torch.eye(heads))
        if a["gate"]:
            self.gate = nn.Parameter(torch.ones(heads))
        if a["temperature"]:
            self.temperature = nn.Parameter(torch.ones(heads, 1, 1))
        if a["head_bias"]:
            self.head_bias = nn.Parameter(torch.zeros(heads, hd))
        if a["table"]:
            self.rel_table = nn.Parameter(torch.zeros(tokens, tokens, heads))
        if a["qk_norm"]:
            size = hd if a["qk_norm"] == "head" else heads * hd
            self.q_norm, self.k_norm = nn.LayerNorm(size), nn.LayerNorm(size)
        if a["memory"]:
            self.memory = nn.Parameter(torch.randn(1, a["memory"], width))

    def _split(self, y: torch.Tensor) -> torch.Tensor:
        mode, o = self.opts["split"], self.opts
        shape = {"width_attr": lambda: (-1, getattr(self, o["width_attr"])),
                 "count_attr": lambda: (getattr(self, o["count_attr"]), -1),
                 "both_attr": lambda: (getattr(self, o["count_attr"]), getattr(self, o["width_attr"])),
                 "const_width": lambda: (-1, o["hd"]), "const_count": lambda: (o["heads"], -1)}[mode]()
        return y.unflatten(-1, shape).transpose(1, 2)

    def forward(self, x):
        o = self.opts
        q_name, k_name, v_name, o_name = o["names"]
        source = self.memory.expand(len(x), -1, -1) if o["memory"] else x
        if o["fused"]:
            q, k, v = getattr(self, q_name)(x).chunk(3, -1)
        else:
            calls = {0: lambda: getattr(self, q_name)(x), 1: lambda: getattr(self, k_name)(source),
                     2: lambda: getattr(self, v_name)(source)}
            done = {role: calls[role]() for role in o["order"]}  # the order the forward uses them in
            q, k, v = done[0], done[1], done[2]
        if o["qk_norm"] == "full":
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = self._split(q), self._split(k), self._split(v)
        if o["qk_norm"] == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        if k.shape[1] != q.shape[1]:  # grouped keys and values
            k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], 1) for t in (k, v))
        if o["impl"] == "sdpa" and not (o["talking"] or o["temperature"] or o["table"]):
            out = F.scaled_dot_product_attention(q, k, v)
        else:
            logits = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
            if o["temperature"]:
                logits = logits * self.temperature
            if o["table"]:
                logits = logits + self.rel_table.permute(2, 0, 1)
            if o["talking"] == "pre":
                logits = torch.einsum("hg,bgij->bhij", self.mix, logits)
            probs = logits.softmax(-1)
            if o["talking"] == "post":
                probs = torch.einsum("hg,bgij->bhij", self.mix, probs)
            out = probs @ v
        if o["gate"]:
            out = out * self.gate[:, None, None]
        if o["head_bias"]:
            out = out + self.head_bias[:, None, :]
        out = out.transpose(1, 2)
        size = {"flat": -1, "const": o["heads"] * o["hd"]}.get(o["merge"]) or getattr(self, o["merge"])
        return getattr(self, o_name)(out.reshape(*out.shape[:2], size))


class ZooFfn(nn.Module):
    def __init__(self, f: dict, width: int):
        super().__init__()
        self.kind, self.names, self.act = f["kind"], f["names"], ACTIVATIONS[f["act"]]()
        n, bias = f["width"], f["bias"]
        if f["kind"] == "gated":
            gate, up, down = f["names"]
            setattr(self, gate, nn.Linear(width, n, bias=bias[0]))
            setattr(self, up, nn.Linear(width, n, bias=bias[0]))
            setattr(self, down, nn.Linear(n, width, bias=bias[1]))
        else:
            rows = 2 * n if f["kind"] == "packed" else n
            setattr(self, f["names"][0], nn.Linear(width, rows, bias=bias[0]))
            setattr(self, f["names"][1], nn.Linear(n, width, bias=bias[1]))
        self.norm = _norm(f["norm"], n) if f["norm"] else nn.Identity()

    def forward(self, x):
        if self.kind == "gated":
            gate, up, down = (getattr(self, n) for n in self.names)
            return down(self.norm(self.act(gate(x)) * up(x)))
        fc1, fc2 = (getattr(self, n) for n in self.names)
        if self.kind == "packed":
            value, gate = fc1(x).chunk(2, -1)
            return fc2(self.norm(self.act(gate) * value))
        return fc2(self.norm(self.act(fc1(x))))


def _ffn(f: dict, width: int) -> nn.Module:
    if f["sequential"]:  # the FFN is an nn.Sequential: its projections are "0" and "2" (or "3" after a norm)
        norm = [_norm(f["norm"], f["width"])] if f["norm"] else []
        return nn.Sequential(nn.Linear(width, f["width"]), ACTIVATIONS[f["act"]](), *norm,
                             nn.Linear(f["width"], width))
    return ZooFfn(f, width)


class ZooBlock(nn.Module):
    def __init__(self, z: dict, width: int, tokens: int):
        super().__init__()
        b = z["block"]
        self.opts = b
        self.n1, self.n2 = _norm(b["norm_kind"], width), _norm(b["norm_kind"], width)
        setattr(self, b["attn_name"], ZooAttention(z["attn"], width, tokens))
        setattr(self, b["ffn_name"], _ffn(z["ffn"], width))
        if b["layer_scale"]:
            self.ls1, self.ls2 = nn.Parameter(torch.full((width,), 0.5)), nn.Parameter(torch.full((width,), 0.5))

    def forward(self, x):
        b = self.opts
        attn, ffn = getattr(self, b["attn_name"]), getattr(self, b["ffn_name"])
        if b["parallel"]:
            return x + attn(self.n1(x)) + ffn(self.n2(x))
        if b["norm"] == "post":
            return self.n2((y := self.n1(x + attn(x))) + ffn(y))
        ls1, ls2 = (self.ls1, self.ls2) if b["layer_scale"] else (1.0, 1.0)
        for _ in range(2 if b["attn_twice"] else 1):
            x = x + ls1 * attn(self.n1(x))
        for _ in range(2 if b["ffn_twice"] else 1):
            x = x + ls2 * ffn(self.n2(x))
        return x


class ConvBlock(nn.Module):  # a ResNet-style block: no attention at all
    def __init__(self, width: int):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(width, width, 3, padding=1), nn.Conv2d(width, width, 3, padding=1)

    def forward(self, x):
        return x + self.conv2(F.relu(self.conv1(x)))


class MixerBlock(nn.Module):  # MLP-Mixer: token-mixing and channel-mixing MLPs, no attention
    def __init__(self, width: int, tokens: int):
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.token_fc1, self.token_fc2 = nn.Linear(tokens, 2 * tokens), nn.Linear(2 * tokens, tokens)
        self.fc1, self.fc2 = nn.Linear(width, 48), nn.Linear(48, width)

    def forward(self, x):
        x = x + self.token_fc2(F.gelu(self.token_fc1(self.n1(x).transpose(1, 2)))).transpose(1, 2)
        return x + self.fc2(F.gelu(self.fc1(self.n2(x))))


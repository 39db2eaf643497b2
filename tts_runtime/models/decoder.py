"""One decoder-only transformer for the Llama family and Gemma 3, over a paged KV cache.

The model takes a flat batch (all sequences' new tokens concatenated) and returns final
hidden states; the engine decides which rows need logits and over which vocabulary
columns (`compute_logits`), because the output layer is the most expensive matmul for
small models with large vocabularies. A process reward model (Qwen2ForProcessRewardModel)
has a small classifier (`score`) in place of the LM head: its "columns" are the classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from tts_runtime.models.arch import ArchConfig, RopeConfig
from tts_runtime.models.layers import (EAGER_OPS, GatedMLP, LayerOps, RMSNorm, inverse_frequencies, project,
                                       rotary_cos_sin)

class AttentionMetadata(Protocol):
    """What the layers read of a batch's attention inputs (executor/batch.py's
    AttentionMetadata; the executor sits above the models)."""

    slot_mapping: torch.Tensor


class AttentionBackend(Protocol):
    """What the layers call of an attention backend (executor/attention/attention.py)."""

    def store_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None: ...

    def attend(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
               scale: float, window: int | None, softcap: float | None) -> torch.Tensor: ...


class Attention(nn.Module):
    def __init__(self, arch: ArchConfig, layer: int) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = arch.num_heads, arch.num_kv_heads, arch.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = nn.Linear(arch.hidden_size, self.q_size + 2 * self.kv_size, bias=arch.attention_bias)
        self.o_proj = nn.Linear(self.q_size, arch.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.head_dim, arch.rms_norm_eps, True) if arch.is_gemma else None
        self.k_norm = RMSNorm(self.head_dim, arch.rms_norm_eps, True) if arch.is_gemma else None
        self.scale = arch.attention_scale
        self.window = arch.layer_window[layer]
        self.softcap = arch.attn_logit_softcapping

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                kv_cache: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata,
                backend: AttentionBackend, ops: LayerOps, keep: torch.Tensor | None = None) -> torch.Tensor:
        """`keep`: the rows to return (the output projection runs on those only); every row's
        K/V is stored and attended with."""
        t = x.shape[0]
        q, k, v = project(x, self.qkv_proj, ops).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q, ops), self.k_norm(k, ops)
        q, k = ops.rotary_qk(q, k, cos, sin)
        k_cache, v_cache = kv_cache
        backend.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        out = backend.attend(q, k_cache, v_cache, meta, self.scale, self.window, self.softcap).reshape(t, self.q_size)
        return project(out if keep is None else out[keep], self.o_proj, ops)


class DecoderLayer(nn.Module):
    def __init__(self, arch: ArchConfig, layer: int) -> None:
        super().__init__()
        gemma = arch.is_gemma
        self.self_attn = Attention(arch, layer)
        self.mlp = GatedMLP(arch.hidden_size, arch.intermediate_size, arch.hidden_act)
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, gemma)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, gemma)
        # Gemma normalises both sides of each sublayer ("sandwich" norms).
        self.pre_feedforward_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, True) if gemma else None
        self.post_feedforward_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, True) if gemma else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                kv_cache: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata,
                backend: AttentionBackend, ops: LayerOps, keep: torch.Tensor | None = None) -> torch.Tensor:
        """`keep`: past attention, only these rows (see DecoderModel.run_layers)."""
        h = self.self_attn(self.input_layernorm(x, ops), cos, sin, kv_cache, meta, backend, ops, keep)
        if keep is not None:
            x = x[keep]
        if self.pre_feedforward_layernorm is None:
            x = x + h
            return x + self.mlp(self.post_attention_layernorm(x, ops), ops)
        x = x + self.post_attention_layernorm(h, ops)
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x, ops), ops), ops)


# The reward head's checkpoint tensors (HF Qwen2ForProcessRewardModel: Linear, ReLU, Linear).
_REWARD_HEAD_WEIGHTS = ("score.0.weight", "score.0.bias", "score.2.weight", "score.2.bias")


@dataclass(frozen=True)
class ModelPart:
    """The share of a model one pipeline stage holds."""
    layers: range
    embedding: bool  # the first stage embeds the tokens
    head: bool  # the last stage norms and computes logits


class DecoderModel(nn.Module):
    def __init__(self, arch: ArchConfig) -> None:
        super().__init__()
        self.arch = arch
        # Given its weight, Embedding skips its random init: on the meta device the loader
        # builds on, that init's first call imports torch._dynamo (1.3 s of every start-up).
        self.embed_tokens = nn.Embedding(arch.vocab_size, arch.hidden_size,
                                         _weight=torch.empty(arch.vocab_size, arch.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(arch, i) for i in range(arch.num_layers))
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, arch.is_gemma)
        untied = not arch.tie_word_embeddings and not arch.has_reward_head
        self.lm_head = nn.Linear(arch.hidden_size, arch.vocab_size, bias=False) if untied else None
        # Named and shaped as HF's Qwen2ForProcessRewardModel (`score.0`, `score.2`), so its
        # checkpoint loads as is.
        self.score = nn.Sequential(
            nn.Linear(arch.hidden_size, arch.hidden_size), nn.ReLU(),
            nn.Linear(arch.hidden_size, arch.reward_labels)) if arch.has_reward_head else None
        # Layers share rope tables when their rope configs agree (Gemma: local vs global).
        self._ropes: list[RopeConfig] = list(dict.fromkeys(arch.layer_rope))
        self._layer_rope_slot = [self._ropes.index(r) for r in arch.layer_rope]
        self._inv_freqs: dict[torch.device, list[torch.Tensor]] = {}

    def _inverse_frequencies(self, device: torch.device) -> list[torch.Tensor]:
        # Kept out of the parameters/buffers so dtype casts never touch them (fp32, like HF).
        if device not in self._inv_freqs:
            self._inv_freqs[device] = [inverse_frequencies(r, self.arch.head_dim).to(device)
                                       for r in self._ropes]
        return self._inv_freqs[device]

    @property
    def output_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata,
                backend: AttentionBackend, ops: LayerOps = EAGER_OPS,
                output_rows: torch.Tensor | None = None) -> torch.Tensor:
        """Final hidden states of every row, or of `output_rows` only (run_layers)."""
        x = self.embed(input_ids)
        x = self.run_layers(x, positions, kv_caches, meta, backend, ops, range(len(self.layers)), output_rows)
        return self.norm(x, ops)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        if self.arch.is_gemma:
            x = x * torch.tensor(self.arch.hidden_size ** 0.5, dtype=x.dtype)
        return x

    def run_layers(self, x: torch.Tensor, positions: torch.Tensor,
                   kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata,
                   backend: AttentionBackend, ops: LayerOps, layers: range,
                   output_rows: torch.Tensor | None = None) -> torch.Tensor:
        """Layers `layers` (a pipeline stage's slice); `kv_caches[i]` belongs to layer
        `layers[i]`. With `output_rows`, the model's last layer (where in `layers`) runs past
        attention on those rows only and returns them: nothing reads the other rows' last
        hidden states, only the K/V every layer stores. A PRM chunk of a few hundred tokens
        is read at one label position, so its last layer's output projection and MLP shrink
        to that row."""
        tables = [rotary_cos_sin(f, positions, x.dtype) for f in self._inverse_frequencies(positions.device)]
        last = len(self.layers) - 1
        for index, kv_cache in zip(layers, kv_caches):
            cos, sin = tables[self._layer_rope_slot[index]]
            keep = output_rows if index == last else None
            x = self.layers[index](x, cos, sin, kv_cache, meta, backend, ops, keep)
        return x

    def drop_layers_outside(self, part: ModelPart) -> None:
        """Free the weights a pipeline stage never runs (other stages' layers; the embedding
        unless the stage embeds or the head is tied to it; the final norm and head unless last).
        On a meta-device model this happens before any weight is allocated or read."""
        for index in range(len(self.layers)):
            if index not in part.layers:
                self.layers[index] = nn.Identity()
        if not part.head:
            self.lm_head = None if self.lm_head is None else nn.Identity()
            self.score = None
        if not part.embedding and not (part.head and self.lm_head is None):
            self.embed_tokens = nn.Identity()

    def hf_names(self) -> set[str] | None:
        """The checkpoint tensors this (possibly partial) model reads; None: all of them."""
        if all(isinstance(layer, DecoderLayer) for layer in self.layers):
            return None
        names = {f"model.layers.{i}." for i, layer in enumerate(self.layers) if isinstance(layer, DecoderLayer)}
        names.add("model.norm.weight")
        if isinstance(self.embed_tokens, nn.Embedding):
            names.add("model.embed_tokens.weight")
        if isinstance(self.lm_head, nn.Linear):
            names.add("lm_head.weight")
        if self.score is not None:
            names.update(_REWARD_HEAD_WEIGHTS)
        return names

    def compute_logits(self, hidden: torch.Tensor, columns: torch.Tensor | None = None,
                       ops: LayerOps = EAGER_OPS) -> torch.Tensor:
        """Logits for the given rows; `columns` restricts the output layer to those token ids
        (with a reward head: to those classes)."""
        if self.score is not None:
            return self._reward_logits(hidden, columns)
        weight = self.output_weight if columns is None else self.output_weight[columns]
        logits = ops.linear(hidden, weight, None)
        cap = self.arch.final_logit_softcapping
        if cap is not None:
            logits = cap * torch.tanh(logits / cap)
        return logits

    def _reward_logits(self, hidden: torch.Tensor, columns: torch.Tensor | None) -> torch.Tensor:
        if columns is None and hidden.shape[0]:
            raise ValueError("this model has a reward head instead of an LM head: it scores, it cannot generate")
        logits = self.score(hidden)
        return logits if columns is None else logits[:, columns]

    def load_hf_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Map HF parameter names onto this module, fusing q/k/v and gate/up."""
        own = self.state_dict()
        loaded: set[str] = set()

        def put(name: str, tensor: torch.Tensor) -> None:
            own[name].copy_(tensor)
            loaded.add(name)

        for i in range(self.arch.num_layers):
            if not isinstance(self.layers[i], DecoderLayer):
                continue  # another pipeline stage's layer
            p = f"model.layers.{i}."
            attn = p + "self_attn."
            put(f"layers.{i}.self_attn.qkv_proj.weight", torch.cat(
                [state[attn + f"{n}_proj.weight"] for n in "qkv"]))
            if self.arch.attention_bias:
                put(f"layers.{i}.self_attn.qkv_proj.bias", torch.cat(
                    [state[attn + f"{n}_proj.bias"] for n in "qkv"]))
            put(f"layers.{i}.mlp.gate_up_proj.weight", torch.cat(
                [state[p + "mlp.gate_proj.weight"], state[p + "mlp.up_proj.weight"]]))
            for name in own:
                prefix = f"layers.{i}."
                if name.startswith(prefix) and name not in loaded and "qkv_proj" not in name \
                        and "gate_up_proj" not in name:
                    put(name, state["model." + name])
        if "embed_tokens.weight" in own:
            put("embed_tokens.weight", state["model.embed_tokens.weight"])
        put("norm.weight", state["model.norm.weight"])
        if "lm_head.weight" in own:
            put("lm_head.weight", state["lm_head.weight"])
        for name in _REWARD_HEAD_WEIGHTS if self.score is not None else ():
            put(name, state[name])
        missing = set(own) - loaded
        if missing:
            raise ValueError(f"checkpoint is missing weights: {sorted(missing)[:5]}")

"""Architecture description read from an HF `config.json`: one dataclass for the Llama
family (Llama 3.x, SmolLM2, Qwen2/2.5) and Gemma 3, which differ by a few switches."""

from __future__ import annotations

from dataclasses import dataclass

from tts_runtime.config import ConfigError

_LLAMA_FAMILY = {"llama", "qwen2", "mistral"}
_GEMMA3 = {"gemma3_text", "gemma3"}
# HF architecture names with a reward head instead of the LM head, and the head's classes.
# Qwen2.5-Math-PRM's remote code fixes num_labels = 2 (its config carries no count).
REWARD_HEAD_LABELS = {"Qwen2ForProcessRewardModel": 2}
# Gemma 3's multimodal wrapper loads as its text model (arch_from_hf reads text_config).
_LM_WRAPPERS = {"Gemma3ForConditionalGeneration"}


@dataclass(frozen=True)
class RopeConfig:
    theta: float
    scaling: dict | None = None  # llama3-style frequency scaling parameters

    def __hash__(self) -> int:
        # Layers sharing a config share rope tables; the scaling dict alone is unhashable.
        return hash((self.theta, tuple(sorted(self.scaling.items())) if self.scaling else None))


@dataclass(frozen=True)
class ArchConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    hidden_act: str
    # Per layer: rope and sliding window (None = global attention).
    layer_rope: tuple[RopeConfig, ...]
    layer_window: tuple[int | None, ...]
    attention_scale: float
    final_logit_softcapping: float | None
    attn_logit_softcapping: float | None
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    # Classes of a reward head (Qwen2ForProcessRewardModel) that replaces the LM head; None: LM head.
    reward_labels: int | None = None

    @property
    def is_gemma(self) -> bool:
        return self.model_type in _GEMMA3

    @property
    def has_reward_head(self) -> bool:
        return self.reward_labels is not None

    def kv_bytes_per_token(self, bytes_per_element: int) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * bytes_per_element

    def num_parameters(self) -> int:
        attn = self.hidden_size * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
        mlp = 3 * self.hidden_size * self.intermediate_size
        # A reward head replaces the LM head: one vocabulary table, plus the head's two layers.
        tables = 1 if self.tie_word_embeddings or self.has_reward_head else 2
        embed = self.vocab_size * self.hidden_size * tables
        head = self.hidden_size * (self.hidden_size + self.reward_labels) if self.has_reward_head else 0
        return self.num_layers * (attn + mlp) + embed + head


def _rope_for(hf: dict, layer_type: str) -> RopeConfig:
    params = hf.get("rope_parameters")
    if isinstance(params, dict) and layer_type in params:  # per-layer-type (Gemma 3, transformers 5)
        params = params[layer_type]
    if isinstance(params, dict) and "rope_theta" in params:
        scaling = params if params.get("rope_type", "default") != "default" else None
        return RopeConfig(float(params["rope_theta"]), scaling)
    if layer_type == "sliding_attention" and "rope_local_base_freq" in hf:
        return RopeConfig(float(hf["rope_local_base_freq"]))
    scaling = hf.get("rope_scaling")
    if scaling and scaling.get("rope_type", scaling.get("type")) in (None, "default"):
        scaling = None
    return RopeConfig(float(hf.get("rope_theta", 10000.0)), scaling)


def _eos_ids(hf: dict) -> tuple[int, ...]:
    eos = hf.get("eos_token_id")
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (int(eos),)


def _reward_labels(hf: dict) -> int | None:
    """The reward head's class count, None for a causal LM; a one-line error for any other
    head (sequence classifiers, outcome reward models), whose weights we would not load.
    A GGUF-converted config names no architecture: those are causal LMs."""
    reward = [REWARD_HEAD_LABELS[n] for n in hf.get("architectures") or () if n in REWARD_HEAD_LABELS]
    unknown = [n for n in hf.get("architectures") or ()
               if n not in REWARD_HEAD_LABELS and n not in _LM_WRAPPERS and not n.endswith("ForCausalLM")]
    if unknown:
        raise ConfigError(f"unsupported architecture '{unknown[0]}': tts runs causal LMs (*ForCausalLM) and "
                          f"the reward head of {', '.join(REWARD_HEAD_LABELS)}")
    return reward[0] if reward else None


def arch_from_hf(hf: dict) -> ArchConfig:
    model_type = hf.get("model_type", "")
    if model_type not in _LLAMA_FAMILY | _GEMMA3:
        raise ConfigError(f"unsupported architecture '{model_type}': tts runs the Llama family "
                          "(llama, qwen2, mistral) and Gemma 3")
    reward_labels = _reward_labels(hf)
    if model_type == "gemma3":  # multimodal wrapper: the text config is nested
        hf = {**hf.get("text_config", {}), "model_type": "gemma3_text"}
        model_type = "gemma3_text"
    num_layers = hf["num_hidden_layers"]
    num_heads = hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // num_heads
    gemma = model_type in _GEMMA3
    layer_types = hf.get("layer_types") or ["full_attention"] * num_layers
    window = hf.get("sliding_window")
    if gemma:
        scale = float(hf.get("query_pre_attn_scalar", head_dim)) ** -0.5
        windows = tuple(window if t == "sliding_attention" else None for t in layer_types)
    else:
        scale = head_dim ** -0.5
        use_window = hf.get("use_sliding_window", False) and window
        windows = tuple(window if use_window else None for _ in range(num_layers))
    return ArchConfig(
        model_type=model_type,
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=hf.get("num_key_value_heads", num_heads),
        head_dim=head_dim,
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(hf.get("max_position_embeddings", 8192)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", gemma)),
        attention_bias=bool(hf.get("attention_bias", model_type == "qwen2")),
        hidden_act=hf.get("hidden_activation") or hf.get("hidden_act", "silu"),
        layer_rope=tuple(_rope_for(hf, t) for t in layer_types),
        layer_window=windows,
        attention_scale=scale,
        final_logit_softcapping=hf.get("final_logit_softcapping"),
        attn_logit_softcapping=hf.get("attn_logit_softcapping"),
        eos_token_ids=_eos_ids(hf),
        bos_token_id=hf.get("bos_token_id"),
        reward_labels=reward_labels,
    )

"""Greedy generation and scoring match HF transformers on the real demo models."""

from __future__ import annotations

import pytest
import torch

from tts_runtime import CacheConfig, Engine, EngineConfig, SamplingParams, SchedulerConfig, ScoreParams

from tests.helpers import QUESTIONS, question_prompts

NEW_TOKENS = 64


def _hf_greedy(hf, prompts: list[list[int]], new_tokens: int, eos: set[int]) -> list[list[int]]:
    """HF's greedy continuations of `prompts`, in one left-padded batch (the tokens of one
    prompt at a time, at a fifth of the time), each cut at its first end-of-sequence."""
    width = max(map(len, prompts))
    pad = hf.generation_config.pad_token_id
    pad = pad if isinstance(pad, int) else min(eos)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = hf.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False, pad_token_id=pad)
    rows = out[:, width:].tolist()
    return [row[:next((i for i, token in enumerate(row) if token in eos), len(row))] for row in rows]


@pytest.fixture(scope="module", params=["generator", "prm"])
def case(request, generator_model, prm_model, hf_reference):
    loaded = generator_model if request.param == "generator" else prm_model
    prompts = question_prompts(loaded)
    eos = set(loaded.arch.eos_token_ids) | {loaded.tokenizer.eos_token_id}
    hf = hf_reference(loaded)
    expected = _hf_greedy(hf, prompts, NEW_TOKENS, eos)
    return loaded, prompts, expected


GREEDY = SamplingParams(temperature=0, max_tokens=NEW_TOKENS)


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_batch16_with_small_chunks_matches_hf(case, prefix_caching):
    loaded, prompts, expected = case
    shortest = min(len(p) for p in prompts)
    config = EngineConfig(cache=CacheConfig(enable_prefix_caching=prefix_caching),
                          scheduler=SchedulerConfig(max_prefill_chunk=shortest // 2))
    engine = Engine(loaded.name, config, loaded=loaded)
    outputs = engine.generate(prompts + prompts, GREEDY)  # 16 sequences in one batch
    assert [o.completions[0].token_ids for o in outputs] == expected + expected
    again = engine.generate(prompts, GREEDY)  # the prompts' full blocks are cached by now
    assert [o.completions[0].token_ids for o in again] == expected
    cached = sum(o.num_cached_prompt_tokens for o in again)
    assert cached > 0 if prefix_caching else cached == 0


def test_batch1_sequential_matches_hf(case):
    loaded, prompts, expected = case
    engine = Engine(loaded.name, EngineConfig(), loaded=loaded)
    alone = prompts[:4]  # one at a time: a batch of one, each prompt's whole decode alone
    got = [engine.generate([p], GREEDY)[0].completions[0].token_ids for p in alone]
    assert got == expected[:len(alone)]
    again = engine.generate([prompts[0]], GREEDY)[0]  # a repeated prompt is served from the cache
    assert again.completions[0].token_ids == expected[0]
    assert again.num_cached_prompt_tokens == (len(prompts[0]) - 1) // engine.block_size * engine.block_size


def _hf_probs(hf, ids: list[int], positions: list[int], candidates: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0]
    return logits[positions][:, candidates].softmax(-1)


@pytest.mark.parametrize("cached_prefix", [False, True])
def test_score_matches_hf_forward(prm_model, hf_reference, cached_prefix):
    tok = prm_model.tokenizer
    question = tok("Question: what is 7 * 8 - 6?\nStep 1: 7 * 8 = 56.\n\n")["input_ids"]
    step = tok("Step 2: 56 - 6 = 50. Is this step correct? Answer:", add_special_tokens=False)["input_ids"]
    ids = question + step
    candidates = [tok.convert_tokens_to_ids(t) for t in ["▁Yes", "▁No", "▁yes"]]
    positions = [len(question) + 3, len(ids) - 1]
    engine = Engine(prm_model.name, EngineConfig(), loaded=prm_model)
    if cached_prefix:
        engine.score([question + [tok.eos_token_id]], ScoreParams([0], candidates))
    out = engine.score([ids], ScoreParams(positions, candidates))[0]
    if cached_prefix:
        # The question's full blocks and the first request's partial last block (a tail,
        # which ends where the two requests' tokens part).
        assert len(question) % engine.block_size
        assert out.num_cached_prompt_tokens == len(question)
    else:
        assert out.num_cached_prompt_tokens == 0
    expected = _hf_probs(hf_reference(prm_model), ids, positions, candidates)
    assert torch.tensor(out.scores).sub(expected).abs().max().item() <= 1e-4


def test_pruned_last_layer_scores_and_generates_as_the_whole_layer(generator_model, prm_model):
    """--prune-last-layer: the last layer's MLP sees only the rows whose logits are read (a
    scored chunk's label positions; a prompt's last token), and the scores and greedy tokens
    are those of the whole layer."""
    tok = prm_model.tokenizer
    ids = tok("Question: what is 7 * 8 - 6?\nStep 1: 7 * 8 = 56.\n\nStep 2: 56 - 6 = 50. Answer:")["input_ids"]
    candidates = [tok.convert_tokens_to_ids(t) for t in ["▁Yes", "▁No"]]
    positions = [len(ids) - 20, len(ids) - 1]
    prompts = question_prompts(generator_model)[:3]
    results = {}
    for prune in (True, False):
        config = EngineConfig(prune_last_layer=prune, cache=CacheConfig(enable_prefix_caching=False))
        seen: list[int] = []
        handles = [loaded.model.layers[-1].mlp.register_forward_hook(lambda m, args, out: seen.append(args[0].shape[0]))
                   for loaded in (prm_model, generator_model)]
        try:
            scores = Engine(prm_model.name, config, loaded=prm_model).score([ids], ScoreParams(positions, candidates))
            score_rows = list(seen)
            seen.clear()
            generated = Engine(generator_model.name, config, loaded=generator_model).generate(
                prompts, SamplingParams(temperature=0, max_tokens=8))
        finally:
            for handle in handles:
                handle.remove()
        results[prune] = (scores[0].scores, [o.completions[0].token_ids for o in generated])
        # The prefill of 3 prompts in one forward; then 7 decode steps of 3 rows.
        if prune:
            assert score_rows == [len(positions)] and seen == [len(prompts)] * 8
        else:
            assert score_rows == [len(ids)] and seen == [sum(len(p) for p in prompts)] + [len(prompts)] * 7
    (pruned_scores, pruned_tokens), (whole_scores, whole_tokens) = results[True], results[False]
    assert torch.tensor(pruned_scores).sub(torch.tensor(whole_scores)).abs().max().item() <= 1e-6
    assert pruned_tokens == whole_tokens


def test_one_batch_mixing_logits_and_probability_scores(prm_model):
    """Score rows of one forward go to each request in the form it asked for: raw logits
    for return_logits, their softmax otherwise."""
    tok = prm_model.tokenizer
    ids = tok("Question: what is 7 * 8?\nStep 1: 56. Is this step correct? Answer:")["input_ids"]
    candidates = [tok.convert_tokens_to_ids(t) for t in ["▁Yes", "▁No"]]
    positions = [len(ids) - 3, len(ids) - 1]
    engine = Engine(prm_model.name, EngineConfig(cache=CacheConfig(enable_prefix_caching=False)), loaded=prm_model)
    logits, probs = engine.score([ids, ids], [ScoreParams(positions, candidates, return_logits=True),
                                              ScoreParams(positions, candidates)])
    assert torch.tensor(logits.scores).softmax(-1).sub(torch.tensor(probs.scores)).abs().max().item() <= 1e-6
    assert torch.tensor(probs.scores).sum(-1).sub(1).abs().max().item() <= 1e-6
    assert torch.tensor(logits.scores).sum(-1).sub(1).abs().max().item() > 1e-3


def test_gemma_sliding_window_prefill_and_decode(prm_model, hf_reference):
    """A prompt longer than Gemma's 512-token window, prefilled in chunks, then decoded."""
    tok = prm_model.tokenizer
    text = " ".join(f"Fact {i}: {i} squared is {i * i}." for i in range(1, 60))
    ids = tok(text + " Therefore 61 squared is")["input_ids"]
    assert len(ids) > prm_model.arch.layer_window[0]
    engine = Engine(prm_model.name, EngineConfig(scheduler=SchedulerConfig(max_prefill_chunk=200)), loaded=prm_model)
    got = engine.generate([ids], SamplingParams(temperature=0, max_tokens=12))[0].completions[0].token_ids
    eos = {tok.eos_token_id}
    assert got == _hf_greedy(hf_reference(prm_model), [ids], 12, eos)[0]


def test_llama3_rope_scaling_matches_hf(tmp_path, generator_model):
    """Llama 3's frequency scaling (the seed models' `dummy:llama-3.*` shapes): a tiny random
    checkpoint scores like HF's, and unlike HF without the scaling, so the check can fail."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from tts_runtime.models.loader import load_model

    tok = generator_model.tokenizer
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}

    def tiny(rope_scaling):
        config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                             rope_theta=10000.0, rope_scaling=rope_scaling, initializer_range=0.2,
                             tie_word_embeddings=False)
        torch.manual_seed(0)
        return LlamaForCausalLM(config).float().eval()

    hf = tiny(scaling)
    hf.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), torch.float32, torch.device("cpu"))
    assert loaded.arch.layer_rope[0].scaling is not None
    ids = tok(" ".join(QUESTIONS * 2))["input_ids"][:300]
    positions, candidates = [10, 150, 299], [11, 12, 13]
    engine = Engine(loaded.name, EngineConfig(device="cpu"), loaded=loaded)
    scores = torch.tensor(engine.score([ids], ScoreParams(positions, candidates))[0].scores)
    assert scores.sub(_hf_probs(hf, ids, positions, candidates)).abs().max().item() <= 1e-4
    assert scores.sub(_hf_probs(tiny(None), ids, positions, candidates)).abs().max().item() > 1e-3

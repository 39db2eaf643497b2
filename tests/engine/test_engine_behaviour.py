"""Engine behaviour on the real generator: forking, preemption, seeding, stops, errors."""

from __future__ import annotations

import pytest
import torch

from tts_runtime import CacheConfig, ConfigError, Engine, EngineConfig, SamplingParams, ScoreParams
from tts_runtime.executor.batch import group_by_length
from tts_runtime.models.registry import resolve

MATH = ("A bakery sells muffins for $3 each and cookies for $2 each. Maria buys 4 muffins and "
        "some cookies and spends $20. How many cookies did she buy?")


@pytest.fixture(scope="module")
def prompt(generator_model) -> list[int]:
    return generator_model.tokenizer.apply_chat_template(
        [{"role": "user", "content": MATH}], tokenize=True, add_generation_prompt=True, return_dict=False)


def test_n_children_share_the_prompt_blocks(generator_model, prompt):
    engine = Engine(generator_model.name, EngineConfig(), loaded=generator_model)
    params = SamplingParams(temperature=0.8, n=4, max_tokens=8, seed=3, ignore_eos=True)
    engine.add_request("r", prompt, params)
    engine.step()  # prefill + the first token of every child
    sequences = engine.request_sequences("r")
    assert len(sequences) == 4
    full = len(prompt) // engine.block_size
    shared = sequences[0].block_table[:full]
    for child in sequences[1:]:
        assert child.block_table[:full] == shared
    assert all(engine.blocks.ref_count(b) == 4 for b in shared)
    # 4 sequences of prompt + 8 tokens would need 4x the blocks without sharing.
    out = engine.run_until_done()[0]
    assert len(out.completions) == 4 and all(len(c.token_ids) == 8 for c in out.completions)
    assert len({tuple(c.token_ids) for c in out.completions}) > 1


def test_forked_children_copy_the_prompts_partial_block_instead_of_recomputing_it(generator_model, prompt):
    """n > 1 with partial-block reuse: each child gets a device copy of the prompt's partial
    last block (queued with the next batch), so its first token runs as a decode; it
    continues as a child that recomputed the block does (the switch off)."""
    block_size = 8
    assert len(prompt) % block_size
    runs = {}
    for reuse in (False, True):
        engine = Engine(generator_model.name, EngineConfig(
            cache=CacheConfig(block_size=block_size, reuse_partial_blocks=reuse)), loaded=generator_model)
        out = engine.generate([prompt], SamplingParams(temperature=0, n=4, max_tokens=8, ignore_eos=True))[0]
        runs[reuse] = ([c.token_ids for c in out.completions], engine.stats.computed_tokens)
    decodes = 4 * 7  # each child's tokens but its last, never fed back
    assert runs[True][1] == len(prompt) + decodes
    assert runs[False][1] == len(prompt) + decodes + 3 * (len(prompt) % block_size)
    assert runs[True][0] == runs[False][0]


def test_preemption_under_tiny_kv_budget_keeps_greedy_outputs(generator_model, prompt):
    greedy = SamplingParams(temperature=0, max_tokens=48)
    prompts = [prompt, prompt[:-3] + prompt[-3:], prompt[5:]]
    roomy = Engine(generator_model.name, EngineConfig(), loaded=generator_model)
    expected = [o.completions[0].token_ids for o in roomy.generate(prompts, greedy)]
    need = -(-(len(prompt) + 48) // 16)
    tight = Engine(generator_model.name, EngineConfig(cache=CacheConfig(num_blocks=need + 2, block_size=16)),
                   loaded=generator_model)
    got = [o.completions[0].token_ids for o in tight.generate(prompts, greedy)]
    assert tight.scheduler.num_preemptions > 0
    assert got == expected


def test_seeded_sampling_is_reproducible_and_batch_independent(generator_model, prompt):
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_tokens=24, seed=1234, ignore_eos=True)
    alone = Engine(generator_model.name, EngineConfig(), loaded=generator_model).generate([prompt], params)
    crowd_params = [SamplingParams(temperature=1.0, max_tokens=30, ignore_eos=True)] * 5 + [params]
    crowd = Engine(generator_model.name, EngineConfig(), loaded=generator_model).generate([prompt] * 6, crowd_params)
    assert alone[0].completions[0].token_ids == crowd[-1].completions[0].token_ids
    other_seed = SamplingParams(**{**params.__dict__, "seed": 99})
    different = Engine(generator_model.name, EngineConfig(), loaded=generator_model).generate([prompt], other_seed)
    assert different[0].completions[0].token_ids != alone[0].completions[0].token_ids


def test_stop_strings_cut_exactly(generator_model, prompt):
    engine = Engine(generator_model.name, EngineConfig(), loaded=generator_model)
    free = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=80))[0].completions[0]
    assert free.finish_reason == "eos"
    for stop in ("\n", " cookies,"):  # a single-token and a multi-token stop string
        assert stop in free.text, "the greedy answer is expected to contain the stop string"
        head = free.text[: free.text.index(stop)]
        kept = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=80, stop=(stop,),
                                                         include_stop_str_in_output=True))[0].completions[0]
        cut = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=80, stop=(stop,)))[0].completions[0]
        assert kept.text == head + stop and kept.finish_reason == "stop"
        assert cut.text == head and cut.finish_reason == "stop"
    short = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=3))[0].completions[0]
    assert short.finish_reason == "length" and len(short.token_ids) == 3
    stop_id = free.token_ids[2]
    by_id = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=80,
                                                      stop_token_ids=(stop_id,)))[0].completions[0]
    assert by_id.finish_reason == "stop" and by_id.token_ids == free.token_ids[:3]


@pytest.mark.parametrize("kwargs, word", [
    ({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"), ({"top_k": -2}, "top_k"),
    ({"min_p": 1.5}, "min_p"), ({"n": 0}, "n must"), ({"max_tokens": 0}, "max_tokens"),
    ({"repetition_penalty": 0}, "repetition_penalty"), ({"stop": ("",)}, "stop"),
])
def test_invalid_sampling_parameters(kwargs, word):
    with pytest.raises(ConfigError, match=word):
        SamplingParams(**kwargs)


def test_bad_models_and_budgets_are_clear_errors(generator_model, prompt, tmp_path):
    with pytest.raises(ConfigError, match="unknown model 'no-such-model'"):
        resolve("no-such-model")
    with pytest.raises(ConfigError, match="unknown model"):
        resolve(str(tmp_path / "missing.gguf"))
    engine = Engine(generator_model.name, EngineConfig(), loaded=generator_model)
    too_long = [1] * (generator_model.arch.max_position_embeddings + 1)
    with pytest.raises(ConfigError, match="context"):
        engine.add_request("long", too_long, SamplingParams())
    small = Engine(generator_model.name, EngineConfig(cache=CacheConfig(num_blocks=2)), loaded=generator_model)
    with pytest.raises(ConfigError, match="KV cache too small"):
        small.add_request("big", prompt, SamplingParams(max_tokens=64))
    with pytest.raises(ConfigError, match="outside the prompt"):
        engine.add_request("score", prompt, ScoreParams([len(prompt)], [1, 2]))
    vocab = generator_model.arch.vocab_size
    # A negative candidate used to be taken, and indexing wrapped it round to the vocabulary's end.
    for candidates in ([1, -1], [1, vocab]):
        with pytest.raises(ConfigError, match=rf"candidate token ids must be in \[0, {vocab}\)"):
            engine.add_request("score", prompt, ScoreParams([0], candidates))
    for ids, words in (([], "empty prompt"), ([1, vocab], "prompt token ids must be in"), ([-1], "prompt token ids")):
        with pytest.raises(ConfigError, match=words):
            engine.add_request("bad ids", ids, SamplingParams())
    with pytest.raises(ConfigError, match="KV cache budget"):
        Engine(generator_model.name, EngineConfig(cache=CacheConfig(kv_cache_bytes=10)), loaded=generator_model)


def test_snapshot_reports_prefix_hits_and_pool_occupancy(generator_model, prompt):
    engine = Engine(generator_model.name, EngineConfig(), loaded=generator_model)
    greedy = SamplingParams(temperature=0, max_tokens=4)
    engine.generate([prompt], greedy)
    first = engine.snapshot()
    assert first["prefix_hits"] == 0 and first["blocks_in_use"] == 0
    # The prompt and 3 of the 4 tokens were computed: their full blocks stay cached, and so
    # does the partial last one (a tail).
    computed = len(prompt) + 3
    assert computed % engine.block_size
    assert first["blocks_cached_free"] == -(-computed // engine.block_size)
    engine.generate([prompt], greedy)
    second = engine.snapshot()
    full = (len(prompt) - 1) // engine.block_size
    assert second["prefix_hits"] == full
    assert second["prefix_queries"] == first["prefix_queries"] + full
    # The tail serves the prompt up to its last token, which is computed (its logits sample).
    assert second["cached_prompt_tokens"] == len(prompt) - 1
    assert second["computed_tokens"] - first["computed_tokens"] == 1 + 3


@pytest.mark.parametrize("block_size", [16, 8, 4])
def test_a_continued_prompt_recomputes_only_what_follows_its_last_full_block(generator_model, prompt, block_size):
    """A search's next step sends the previous prompt plus the tokens it produced. Without
    partial-block reuse the prefix cache serves the full blocks, and the rest (the old partial
    block and the new tokens) is computed again, so smaller blocks recompute less; with it the
    old partial block is taken over too, and only the never-computed last token runs, as a
    decode. Either way the continuation is the same."""
    continuations, forwards = [], []
    for reuse in (False, True):
        engine = Engine(generator_model.name, EngineConfig(
            cache=CacheConfig(block_size=block_size, reuse_partial_blocks=reuse)), loaded=generator_model)
        greedy = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
        step = engine.generate([prompt], greedy)[0].completions[0].token_ids
        continued = prompt + step
        before, forwards = engine.snapshot(), len(engine.stats.decode_batch_sizes)
        continuations.append(engine.generate([continued], greedy)[0].completions[0].token_ids)
        after = engine.snapshot()
        # With the tail, the one token left runs in the decode batch: no forward prefills.
        assert len(engine.stats.decode_batch_sizes) - forwards == (5 if reuse else 4)
        # The first request's KV covers the prompt and 4 of its 5 tokens (the last was sampled, never fed back).
        cached = len(continued) - 1 if reuse else (len(prompt) + len(step) - 1) // block_size * block_size
        assert after["cached_prompt_tokens"] - before["cached_prompt_tokens"] == cached
        assert after["computed_tokens"] - before["computed_tokens"] == len(continued) - cached + 4
        assert engine.blocks.stats.tail_hits == int(reuse and (len(continued) - 1) % block_size != 0)
    assert continuations[0] == continuations[1]


def test_block_size_out_of_range_is_a_config_error():
    for size in (0, 512):
        with pytest.raises(ConfigError, match=f"--block-size must be between 1 and 256 tokens, got {size}"):
            CacheConfig(block_size=size)


def test_a_request_aborted_before_it_was_scheduled_does_not_count_toward_the_hit_rate(generator_model, prompt):
    """Prompt and cached tokens count together: a dropped speculation that never reached the
    prefix cache adds neither, one that did adds both."""
    engine = Engine(generator_model.name, EngineConfig(), loaded=generator_model)
    greedy = SamplingParams(temperature=0, max_tokens=4)
    engine.generate([prompt], greedy)
    before = engine.snapshot()
    engine.add_request("never scheduled", prompt, greedy)
    engine.abort_request("never scheduled")
    assert engine.snapshot()["prompt_tokens"] == before["prompt_tokens"]
    engine.add_request("scheduled", prompt, greedy)
    engine.step()
    engine.abort_request("scheduled")
    after = engine.snapshot()
    assert after["prompt_tokens"] - before["prompt_tokens"] == len(prompt)
    # Full blocks and the first request's partial last block serve all but the last token.
    assert after["cached_prompt_tokens"] - before["cached_prompt_tokens"] == len(prompt) - 1


def test_decode_groups_cover_each_sequence_once_within_the_padding_bound():
    lens = torch.tensor([300, 40, 41, 120, 299, 45, 118, 7], dtype=torch.int32)
    tables = torch.arange(8 * 19, dtype=torch.int32).view(8, 19)
    groups = group_by_length(lens, tables, block_size=16)
    rows = torch.cat([g.rows for g in groups]).tolist()
    assert sorted(rows) == list(range(8)) and len(groups) == 4
    for g in groups:
        assert g.max_len == int(g.context_lens.max()) and g.block_tables.shape[1] == -(-g.max_len // 16)
        assert g.max_len * len(g.rows) <= 1.1 * int(g.context_lens.sum())
        assert torch.equal(g.block_tables, tables[g.rows, : g.block_tables.shape[1]])


def test_length_grouped_decodes_match_one_padded_batch(generator_model, prompt):
    # Prompts from 20 to 120+ tokens: several length groups in every decode step.
    prompts = [prompt[:20], prompt, prompt[:45], prompt + prompt[5:], prompt[:30]]
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outputs = {}
    for grouped in (True, False):
        # The switch belongs to the torch backend (the CPU kernel reads no padding).
        engine = Engine(generator_model.name, EngineConfig(attention_backend="torch", group_decodes_by_length=grouped),
                        loaded=generator_model)
        outputs[grouped] = [o.completions[0].token_ids for o in engine.generate(prompts, greedy)]
    assert outputs[True] == outputs[False]

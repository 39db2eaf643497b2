"""search-and-learn's side of the differential check (evals/sal_diff.py): its own beam search
(`sal.search.beam_search.beam_search`) and its own RLHFlow scoring code on our demo models.

Run in a child process as `python -m evals.sal_side REQUEST.json`, so that S&L's checkout
(and the dependencies of its own that the user points at) is on sys.path only there, and
its vLLM engine and HF PRM are gone before our side starts.

The only S&L code replaced is what its `load_prm` cannot do: it accepts five hard-coded Hub
PRMs. `LocalRLHFlow` subclasses its `RLHFFlow` and loads the demo PRM from its local folder
instead, in float32 (RLHFFlow loads bf16; our side runs float32, the parity dtype), with the
same tokenizer settings RLHFFlow sets. The demo PRM (Gemma-3-270M) carries no chat template,
so it gets Gemma's turn format, as our side uses for a template-less PRM (search/prm.py).
Everything else -- prompts, the chat template, step splitting, the PRM's input, selection,
completion -- is S&L's code as it is in the checkout.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Gemma's chat format: turns are `<start_of_turn>{user|model}\n{content, trimmed}<end_of_turn>\n`,
# after one BOS (apply_chat_template tokenizes without adding special tokens).
GEMMA_TURNS_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\\n' + (message['content'] | trim) + '<end_of_turn>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)


@dataclass
class SalRequest:
    """What the parent asks for: S&L's checkout, the models' HF folders, the settings of
    S&L's `Config` and the problems (id, question)."""

    sal_repo: str
    sal_deps: list[str]
    generator_folder: str
    prm_folder: str
    config: dict[str, Any]
    problems: list[dict[str, str]]
    output: str
    kv_cache_bytes: int = 256 << 20
    max_model_len: int = 4096
    generator_settings: dict[str, Any] = field(default_factory=dict)


def import_sal(sal_repo: str, sal_deps: list[str]) -> None:
    """Put the checkout's `src` (and the user's folders of S&L's own dependencies) first on sys.path."""
    src = Path(sal_repo).expanduser() / "src"
    if not (src / "sal" / "search" / "beam_search.py").is_file():
        raise SystemExit(f"--sal-repo {sal_repo}: no src/sal/search/beam_search.py there; "
                         "pass the root of a search-and-learn checkout")
    for path in reversed([str(src), *sal_deps]):
        sys.path.insert(0, path)


def local_rlhflow_class(prm_folder: str) -> type:
    """S&L's RLHFFlow PRM, loading `prm_folder` instead of its hard-coded Hub id."""
    import torch
    from sal.models.reward_models import RLHFFlow
    from transformers import AutoModelForCausalLM, AutoTokenizer

    class LocalRLHFlow(RLHFFlow):
        def load_model_and_tokenizer(self, **model_kwargs: Any) -> tuple[Any, Any]:
            tokenizer = AutoTokenizer.from_pretrained(prm_folder)
            if not tokenizer.chat_template:
                tokenizer.chat_template = GEMMA_TURNS_TEMPLATE
            model = AutoModelForCausalLM.from_pretrained(prm_folder, dtype=torch.float32, **model_kwargs).eval()
            # As RLHFFlow.load_model_and_tokenizer sets them.
            tokenizer.padding_side = "right"
            tokenizer.pad_token = tokenizer.eos_token
            model.config.pad_token_id = model.config.eos_token_id
            self.candidate_tokens = [tokenizer.encode("+")[-1], tokenizer.encode("-")[-1]]
            return model, _TensorChatTemplate(tokenizer)

    return LocalRLHFlow


class _TensorChatTemplate:
    """The PRM tokenizer as S&L's code expects it: S&L was written against transformers 4,
    whose `apply_chat_template(..., return_tensors="pt")` returned the ids tensor; transformers
    5 returns a BatchEncoding unless asked not to. Everything else passes through."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("tokenize", True):
            kwargs.setdefault("return_dict", False)
        return self._tokenizer.apply_chat_template(*args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._tokenizer(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)


def start_llm(request: SalRequest) -> Any:
    """vLLM as S&L's scripts/test_time_compute.py starts it (prefix caching, the run's seed),
    with the CPU settings our vLLM backend uses: eager, float32, an explicit KV size."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    import torch

    os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
    from vllm import LLM

    return LLM(model=request.generator_folder, tokenizer=request.generator_folder, dtype="float32",
               enable_prefix_caching=True, seed=request.config.get("seed", 0), enforce_eager=True,
               kv_cache_memory_bytes=request.kv_cache_bytes, max_model_len=request.max_model_len,
               **request.generator_settings)


def run(request: SalRequest) -> list[dict[str, Any]]:
    """S&L's `beam_search` on each problem alone (its `_beam_search` cuts across every
    prompt of a batch at once, and its Config requires search_batch_size 1)."""
    import_sal(request.sal_repo, request.sal_deps)
    from sal.config import Config
    from sal.search.beam_search import beam_search

    config = Config(approach="beam_search", model_path=request.generator_folder, prm_path=request.prm_folder,
                    search_batch_size=1, **request.config)
    llm = start_llm(request)
    prm = local_rlhflow_class(request.prm_folder)(config)
    rows = []
    for problem in request.problems:
        result = beam_search({"problem": [problem["question"]]}, config, llm, prm)
        rows.append({"id": problem["id"], "completions": result["completions"][0],
                     "scores": result["scores"][0], "pred": result["pred"][0]})
    return rows


def main(argv: list[str]) -> None:
    request = SalRequest(**json.loads(Path(argv[0]).read_text(encoding="utf-8")))
    rows = run(request)
    Path(request.output).write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def request_json(request: SalRequest) -> str:
    return json.dumps(asdict(request))


if __name__ == "__main__":
    main(sys.argv[1:])

"""Search configuration: search-and-learn's defaults, validated when built.

Beam search and DVTS need `n` divisible by `beam_width` (beam search keeps n // M beams,
DVTS grows n // M subtrees of M candidates), except beam search under `sal_uneven_n`;
best-of-N ignores `beam_width`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from search.aggregate import check_aggregation
from search.grading import check_grader, check_vote_ties
from search.prm import prm_format_class
from search.prompts import load_chat_template
from tts_runtime.config import ConfigError
from tts_runtime.options import option

METHODS: tuple[str, ...] = ("beam", "bon", "dvts")
STEP_DELIMITER = "\n\n"
SURVIVOR_ORDERS: tuple[str, ...] = ("original", "score")
DEFAULT_SEED = 42
SAL_SEED = 0  # every search-and-learn recipe sets seed: 0
# Each is one difference from search-and-learn (docs/semantics.md); None follows `sal_exact`.
SAL_SWITCHES: tuple[str, ...] = ("sal_empty_step", "sal_whole_string", "sal_tie_order", "sal_uneven_n",
                                 "sal_lookahead_unused", "sal_retokenize")


@dataclass(frozen=True)
class SearchConfig:
    method: str = option("beam", "beam, bon or dvts (the command names it).", panel="Search details")
    n: int = option(4, "Beams (beam search), samples (best-of-N), leaves (DVTS).")
    beam_width: int = option(4, "M: beam search keeps n/M beams; DVTS grows n/M subtrees of M.")
    num_iterations: int = option(40, "Most steps per beam.")
    temperature: float = option(0.8, "Sampling temperature (0 is greedy).")
    top_p: float = option(1.0, "Nucleus sampling mass.", panel="Search details")
    # Token cap per step, as search-and-learn's recipes (2048); the demo passes a smaller one.
    max_step_tokens: int = option(2048, "Token cap per step.")
    # Cap for a whole solution: best-of-N samples and the last iteration's run to the end.
    max_tokens: int = option(2048, "Token cap per whole solution (best-of-N, --eos-sampling).")
    aggregation: str = option("last", "Step scores to beam score: last, min, prod, mean.", panel="Search details")
    # The search-and-learn beam-search recipe sets filter_duplicates. With sort_completed off
    # (search-and-learn's default) the first n beams to complete are kept; on, the best n.
    filter_duplicates: bool = option(True, "Drop beams with identical text.", panel="Search details")
    sort_completed: bool = option(False, "Keep the best-scored completed beams (off: the first n to complete).",
                                  panel="Search details")
    # At the last iteration every beam runs to the end (no step stop, `max_tokens` cap) and
    # counts as completed, as search-and-learn does; off, the last iteration is one more step.
    eos_sampling: bool = option(True, "At the last iteration let beams run to the end (--max-tokens) and count "
                                "them completed.", panel="Search details")
    # Fewer than n completed beams are padded to n with copies (search-and-learn); the copies
    # add weight to their answers in the votes.
    pad_completed: bool = option(True, "Pad fewer than n completed beams to n with copies.", panel="Search details")
    # "original": the kept beams stay in the order they were generated (search-and-learn
    # marks the top n // M and keeps the rest of the list in place); "score": best first.
    # The order decides which survivor each refilled copy comes from.
    survivor_order: str = option("original", "Kept beams in generation order ('original') or best first "
                                 "('score').", panel="Search details")
    # Weighted vote: each candidate weighs its `vote_aggregation` score (search-and-learn's
    # score.py always uses the last step's score); equal votes go to the group seen first
    # ("first") or to the one holding the higher single score ("best").
    vote_aggregation: str = option("last", "Step scores to a weighted-vote weight: last, min, prod, mean.",
                                   panel="Search details")
    vote_ties: str = option("first", "Equal votes: 'first' group seen or the 'best' single score.",
                            panel="Search details")
    prm_format: str | None = option(None, "rlhflow, math-shepherd, qwen-prm or judge (default: detected from the "
                                    "PRM checkpoint).", panel="Models")
    # Searches in flight at once; their requests share the engines' batches (16 ran 1.23x
    # the problems/min of 8 on a 2-core CPU in bf16, docs/benchmarks/problem_batch.md).
    problem_batch: int = option(16, "Searches in flight at once.", panel="Search details")
    seed: int | None = option(None, "Search seed (default: 42, or search-and-learn's 0 under --sal-exact).")
    # FastTTS's speculative beam extension (beam search; search/speculation.py): a beam whose
    # step finished starts its next step at once, kept if the beam survives selection,
    # aborted if not. `speculative_max_tokens` caps one speculative step (None: the step's
    # own cap); a speculation cut short by it is discarded and the step generated anew.
    speculative_extension: bool = option(False, "Beam search: a beam whose step finished starts its next step "
                                         "while the others finish (FastTTS); same decisions.",
                                         panel="Search details")
    speculative_max_tokens: int | None = option(None, "Cap of one speculative step (default: the step cap).",
                                                panel="Search details")
    system_prompt: str | None = option(None, "The generator's system prompt (default: search-and-learn's).",
                                       panel="Models")
    chat_template: str | None = option(None, "A Jinja chat template, or a file holding one, replacing the "
                                       "generator tokenizer's own (search-and-learn's custom_chat_template).",
                                       panel="Models")
    grader: str = option("math-verify", "Who decides that an answer is right: math-verify, or qwen (Qwen2.5-Math's "
                         "math_equal rules, which search-and-learn's published accuracies use).",
                         panel="Search details")
    lookahead: int = option(0, "Beam search: also continue each beam greedily for up to this many steps and rank "
                            "it by that rollout's score (search-and-learn's lookahead; 0: none).",
                            panel="Search details")
    # The sal_* switches: None follows sal_exact (docs/semantics.md lists each difference).
    sal_exact: bool = option(False, "Reproduce search-and-learn where it differs from tts (every --sal-* switch "
                             "not given follows this; the seed defaults to 0).", panel="search-and-learn")
    sal_empty_step: bool | None = option(None, "Score a beam whose text ends in a step break with one more, empty "
                                         "step (RLHFlow, Qwen-PRM), which then ranks it, as search-and-learn "
                                         "does.", panel="search-and-learn")
    sal_whole_string: bool | None = option(None, "Math-Shepherd: tokenize the PRM input as one string "
                                           "(search-and-learn) rather than piece by piece.",
                                           panel="search-and-learn")
    sal_tie_order: bool | None = option(None, "Equal scores at the beam-search cut in numpy argsort's order (the "
                                        "later beam wins) instead of the earlier beam first.",
                                        panel="search-and-learn")
    sal_uneven_n: bool | None = option(None, "Beam search: accept n not a multiple of the beam width, keeping "
                                       "n // M beams (all when that is 0).", panel="search-and-learn")
    sal_lookahead_unused: bool | None = option(None, "With --lookahead, rank by the beam's own score as "
                                               "search-and-learn's beam search does (it never scores its "
                                               "rollouts), so no rollouts are made.", panel="search-and-learn")
    sal_retokenize: bool | None = option(None, "Continue a beam from its text re-encoded through the chat template, "
                                         "as search-and-learn does, instead of from the tokens it sampled.",
                                         panel="search-and-learn")

    def __post_init__(self) -> None:
        uneven_n = self.sal_exact if self.sal_uneven_n is None else self.sal_uneven_n
        checks = [
            (self.method in METHODS, f"unknown search method '{self.method}'; choose one of {', '.join(METHODS)}"),
            (self.n >= 1, f"n must be >= 1, got {self.n}"),
            (self.beam_width >= 1, f"beam width must be >= 1, got {self.beam_width}"),
            (self.method == "bon" or self.beam_width < 1 or self.n % self.beam_width == 0
             or (self.method == "beam" and uneven_n),
             f"n ({self.n}) must be a multiple of the beam width ({self.beam_width})"),
            (self.num_iterations >= 1, f"num_iterations must be >= 1, got {self.num_iterations}"),
            (self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}"),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"),
            (self.max_step_tokens >= 1, f"max_step_tokens must be >= 1, got {self.max_step_tokens}"),
            (self.max_tokens >= 1, f"max_tokens must be >= 1, got {self.max_tokens}"),
            (self.problem_batch >= 1, f"problem batch must be >= 1, got {self.problem_batch}"),
            (not self.speculative_extension or self.method == "beam",
             f"speculative extension applies to beam search only, not '{self.method}'; "
             "drop --speculative-extension"),
            (self.speculative_max_tokens is None or self.speculative_max_tokens >= 1,
             f"speculative_max_tokens must be >= 1, got {self.speculative_max_tokens}"),
            (self.lookahead >= 0, f"lookahead must be >= 0, got {self.lookahead}"),
            (self.lookahead == 0 or self.method == "beam",
             f"lookahead applies to beam search only, not '{self.method}'; drop --lookahead"),
            (self.lookahead == 0 or not self.speculative_extension,
             "lookahead and speculative extension do not combine; drop one of them"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(f"invalid search parameter: {message}")
        check_aggregation(self.aggregation)
        check_aggregation(self.vote_aggregation)
        check_vote_ties(self.vote_ties)
        if self.survivor_order not in SURVIVOR_ORDERS:
            raise ConfigError(f"invalid search parameter: survivor order must be one of "
                              f"{', '.join(SURVIVOR_ORDERS)}, got '{self.survivor_order}'")
        if self.prm_format is not None:
            prm_format_class(self.prm_format)
        check_grader(self.grader)
        load_chat_template(self.chat_template)

    def resolved(self) -> SearchConfig:
        """The config the search runs: every `sal_*` switch left unset (None) follows
        `sal_exact`, and an unset seed is 42 (0 under `sal_exact`). The fields themselves keep
        what was given, so a config rebuilt with other options (`--sal-exact` from the command
        line over a file) resolves anew."""
        switches = {name: self.sal_exact for name in SAL_SWITCHES if getattr(self, name) is None}
        seed = {"seed": SAL_SEED if self.sal_exact else DEFAULT_SEED} if self.seed is None else {}
        return replace(self, **switches, **seed) if switches or seed else self

    @property
    def keep(self) -> int:
        """Beams that survive each beam-search iteration (n // M); DVTS subtrees."""
        return self.n // self.beam_width

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

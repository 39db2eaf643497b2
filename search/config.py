"""Search configuration: search-and-learn's defaults, validated when built.

Beam search and DVTS need `n` divisible by `beam_width` (beam search keeps n // M beams,
DVTS grows n // M subtrees of M candidates), except beam search under `sal_uneven_n`;
best-of-N ignores `beam_width`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from search.aggregate import check_aggregation
from search.grading import check_vote_ties
from search.prm import prm_format_class
from tts_runtime.config import ConfigError

METHODS: tuple[str, ...] = ("beam", "bon", "dvts")
STEP_DELIMITER = "\n\n"
SURVIVOR_ORDERS: tuple[str, ...] = ("original", "score")
DEFAULT_SEED = 42
SAL_SEED = 0  # every search-and-learn recipe sets seed: 0
# Each is one difference from search-and-learn (docs/semantics.md); None follows `sal_exact`.
SAL_SWITCHES: tuple[str, ...] = ("sal_empty_step", "sal_whole_string", "sal_tie_order", "sal_uneven_n",
                                 "sal_lookahead_unused")


@dataclass(frozen=True)
class SearchConfig:
    method: str = "beam"
    n: int = 4
    beam_width: int = 4
    num_iterations: int = 40
    temperature: float = 0.8
    top_p: float = 1.0
    # Token cap per step, as search-and-learn's recipes (2048); the demo passes a smaller one.
    max_step_tokens: int = 2048
    # Cap for a whole solution: best-of-N samples and the last iteration's run to the end.
    max_tokens: int = 2048
    aggregation: str = "last"
    # The search-and-learn beam-search recipe sets filter_duplicates. With sort_completed off
    # (search-and-learn's default) the first n beams to complete are kept; on, the best n.
    filter_duplicates: bool = True
    sort_completed: bool = False
    # At the last iteration every beam runs to the end (no step stop, `max_tokens` cap) and
    # counts as completed, as search-and-learn does; off, the last iteration is one more step.
    eos_sampling: bool = True
    # Fewer than n completed beams are padded to n with copies (search-and-learn); the copies
    # add weight to their answers in the votes.
    pad_completed: bool = True
    # "original": the kept beams stay in the order they were generated (search-and-learn
    # marks the top n // M and keeps the rest of the list in place); "score": best first.
    # The order decides which survivor each refilled copy comes from.
    survivor_order: str = "original"
    # Weighted vote: each candidate weighs its `vote_aggregation` score (search-and-learn's
    # score.py always uses the last step's score); equal votes go to the group seen first
    # ("first") or to the one holding the higher single score ("best").
    vote_aggregation: str = "last"
    vote_ties: str = "first"
    prm_format: str | None = None  # None: the PRM's own format (search.prm_detect)
    # Searches in flight at once; their requests share the engines' batches (16 ran 1.23x
    # the problems/min of 8 on a 2-core CPU in bf16, docs/benchmarks/problem_batch.md).
    problem_batch: int = 16
    # None: 42, or search-and-learn's recipe seed 0 under `sal_exact`; a given seed always wins.
    seed: int | None = None
    # FastTTS's speculative beam extension (beam search; search/speculation.py): a beam whose
    # step finished starts its next step at once, kept if the beam survives selection,
    # aborted if not. `speculative_max_tokens` caps one speculative step (None: the step's
    # own cap); a speculation cut short by it is discarded and the step generated anew.
    speculative_extension: bool = False
    speculative_max_tokens: int | None = None
    # Beam search: each active beam is also continued greedily for up to this many steps and
    # ranked by that rollout's aggregated score (the beam keeps only its own step); not at the
    # last iteration. 0: no rollouts.
    lookahead: int = 0
    # Reproduce search-and-learn where it differs (docs/semantics.md): every `sal_*` switch
    # left unset follows this one, and the seed defaults to 0.
    sal_exact: bool = False
    # Score a beam whose text ends in "\n\n" with one more, empty step (RLHFlow, Qwen-PRM), as
    # search-and-learn's split of the text does; that score then ranks the beam.
    sal_empty_step: bool | None = None
    # Math-Shepherd: tokenize the PRM input as one string (search-and-learn) rather than
    # piece by piece (no extra "▁" at piece starts with SentencePiece tokenizers).
    sal_whole_string: bool | None = None
    # Equal scores at the beam-search cut: numpy argsort's order (search-and-learn; the later
    # beam wins) instead of the earlier beam.
    sal_tie_order: bool | None = None
    # Beam search: accept n not a multiple of beam_width, keeping n // beam_width beams (all
    # beams when that is 0), as search-and-learn does.
    sal_uneven_n: bool | None = None
    # Beam search with lookahead: rank by the beam's own score, as search-and-learn's beam
    # search does (it generates the rollouts but never scores them); no rollouts are made.
    sal_lookahead_unused: bool | None = None

    def __post_init__(self) -> None:
        self._resolve_sal_switches()
        checks = [
            (self.method in METHODS, f"unknown search method '{self.method}'; choose one of {', '.join(METHODS)}"),
            (self.n >= 1, f"n must be >= 1, got {self.n}"),
            (self.beam_width >= 1, f"beam width must be >= 1, got {self.beam_width}"),
            (self.method == "bon" or self.beam_width < 1 or self.n % self.beam_width == 0
             or (self.method == "beam" and self.sal_uneven_n),
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

    def _resolve_sal_switches(self) -> None:
        """The one place where `sal_exact` reaches the switches: after this every `sal_*` field
        and `seed` hold plain values, so `to_dict` records what the run did. (A config made by
        `dataclasses.replace` from a built one keeps those resolved values.)"""
        for name in SAL_SWITCHES:
            if getattr(self, name) is None:
                object.__setattr__(self, name, self.sal_exact)
        if self.seed is None:
            object.__setattr__(self, "seed", SAL_SEED if self.sal_exact else DEFAULT_SEED)

    @property
    def keep(self) -> int:
        """Beams that survive each beam-search iteration (n // M); DVTS subtrees."""
        return self.n // self.beam_width

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

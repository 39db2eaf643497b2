"""Search configuration: search-and-learn's defaults, validated when built.

Beam search and DVTS need `n` divisible by `beam_width` (beam search keeps n // M beams,
DVTS grows n // M subtrees of M candidates); best-of-N ignores `beam_width`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from search.aggregate import check_aggregation
from search.prm import prm_format_class
from tts_runtime.config import ConfigError

METHODS: tuple[str, ...] = ("beam", "bon", "dvts")
STEP_DELIMITER = "\n\n"


@dataclass(frozen=True)
class SearchConfig:
    method: str = "beam"
    n: int = 4
    beam_width: int = 4
    num_iterations: int = 40
    temperature: float = 0.8
    top_p: float = 1.0
    # search-and-learn caps every step at 2048 tokens; a step of SmolLM2 rarely passes
    # ~150, and a runaway step costs minutes on a CPU, so the cap is lower here.
    max_step_tokens: int = 256
    # Cap for a whole solution: best-of-N samples and end-of-sequence sampling.
    max_tokens: int = 2048
    aggregation: str = "last"
    # The search-and-learn beam-search recipe sets filter_duplicates; sort_completed
    # makes the kept completed beams the best-scored ones, so the final pick is the
    # best completed beam (with it off, the first n beams to complete are kept).
    filter_duplicates: bool = True
    sort_completed: bool = True
    # At the last iteration let beams run to EOS instead of one more step (search-and-learn
    # always does; the thesis does not).
    eos_sampling: bool = False
    prm_format: str | None = None  # None: the PRM's own format (search.prm.default_format_for)
    # Searches in flight at once; their requests share the engines' batches.
    problem_batch: int = 8
    seed: int = 42

    def __post_init__(self) -> None:
        checks = [
            (self.method in METHODS, f"unknown search method '{self.method}'; choose one of {', '.join(METHODS)}"),
            (self.n >= 1, f"n must be >= 1, got {self.n}"),
            (self.beam_width >= 1, f"beam width must be >= 1, got {self.beam_width}"),
            (self.method == "bon" or self.n % self.beam_width == 0,
             f"n ({self.n}) must be a multiple of the beam width ({self.beam_width})"),
            (self.num_iterations >= 1, f"num_iterations must be >= 1, got {self.num_iterations}"),
            (self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}"),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"),
            (self.max_step_tokens >= 1, f"max_step_tokens must be >= 1, got {self.max_step_tokens}"),
            (self.max_tokens >= 1, f"max_tokens must be >= 1, got {self.max_tokens}"),
            (self.problem_batch >= 1, f"problem batch must be >= 1, got {self.problem_batch}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(f"invalid search parameter: {message}")
        check_aggregation(self.aggregation)
        if self.prm_format is not None:
            prm_format_class(self.prm_format)

    @property
    def keep(self) -> int:
        """Beams that survive each beam-search iteration (n // M); DVTS subtrees."""
        return self.n // self.beam_width

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

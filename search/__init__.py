"""Search API: beam search, best-of-N and DVTS over a co-hosted generator + PRM runtime.

    from search import SearchConfig, run_search
    results = run_search(runtime, problems, SearchConfig(method="beam", n=4, beam_width=4))
"""

from search.config import METHODS, SearchConfig
from search.driver import arun_search, run_search
from search.results import BeamResult, ProblemResult
from search.score_cache import ScoreCache

__all__ = ["METHODS", "BeamResult", "ProblemResult", "ScoreCache", "SearchConfig", "arun_search", "run_search"]

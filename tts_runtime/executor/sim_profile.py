"""What a simulated generator writes, recorded from a real run: how long a step is (in tokens),
after how many steps a beam ends, and which ordinary tokens fill a step.

The simulated device (executor/sim.py) draws tokens from this profile so that the engine,
the detokenizer and the search see step and sequence lengths shaped like a real run's. It is
recorded from a run folder's results.jsonl (each final beam with its step texts), the steps
tokenized with the generator's tokenizer:

    python -m tts_runtime.executor.sim_profile RUN/results.jsonl --model smollm2-135m-instruct

The final beams are the survivors of the search, so the lengths are those of kept steps; the
pruned beams' steps are not in results.jsonl.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from tts_runtime.models.registry import DEFAULT_GENERATOR

DEFAULT_PROFILE = Path(__file__).with_name("sim_profile.json")
# Ordinary tokens kept: the most frequent ones of the run's steps.
_ORDINARY_TOKENS = 512


@dataclass(frozen=True)
class SimProfile:
    model: str  # the generator whose tokenizer the ids belong to
    source: str  # the results.jsonl it was recorded from
    step_lengths: dict[int, int]  # tokens in a step (its separator included) -> steps seen
    steps_per_beam: dict[int, int]  # steps of a beam that ended with EOS -> beams seen
    beams_not_ended: int  # beams that ended otherwise (length cap, iteration cap)
    separator_token_id: int  # the step delimiter ("\n\n") as one token
    eos_token_id: int
    turn_token_id: int | None  # a chat turn's first token: the response's steps follow the last one
    separator_ids: list[list[int]]  # how the delimiter is tokenized inside a prompt (to count steps)
    ordinary_token_ids: list[int]  # tokens without a newline, drawn uniformly inside a step

    def step_end_hazard(self) -> list[float]:
        """hazard[k]: P(a step ends at its token k + 1 | it has k tokens), from the histogram."""
        longest = max(self.step_lengths)
        counts = [self.step_lengths.get(k, 0) for k in range(longest + 1)]
        remaining, hazard = sum(counts), []
        for k in range(1, longest + 1):
            hazard.append(counts[k] / remaining if remaining else 1.0)
            remaining -= counts[k]
        return hazard

    def eos_hazard(self) -> list[float]:
        """hazard[j]: P(step j (0-based) ends the beam with EOS | the beam reached step j)."""
        longest = max(self.steps_per_beam, default=1)
        reached = sum(self.steps_per_beam.values()) + self.beams_not_ended
        hazard = []
        for j in range(1, longest + 1):
            ended = self.steps_per_beam.get(j, 0)
            hazard.append(ended / reached if reached else 1.0)
            reached -= ended
        return hazard

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> SimProfile:
        ints = {"step_lengths", "steps_per_beam"}
        return cls(**{k: ({int(n): c for n, c in v.items()} if k in ints else v) for k, v in data.items()})


def load_profile(path: Path = DEFAULT_PROFILE) -> SimProfile:
    return SimProfile.from_json(json.loads(Path(path).read_text()))


def record_profile(results: Path, tokenizer, model: str) -> SimProfile:
    """The profile of a run's final beams, tokenized with `tokenizer`."""
    lengths: Counter[int] = Counter()
    steps_per_beam: Counter[int] = Counter()
    ordinary: Counter[int] = Counter()
    not_ended = 0
    for line in Path(results).read_text().splitlines():
        for beam in json.loads(line)["beams"]:
            for text in beam["steps"]:
                ids = tokenizer(text, add_special_tokens=False)["input_ids"]
                lengths[len(ids)] += 1
                ordinary.update(ids)
            if beam["finish_reason"] == "eos":
                steps_per_beam[len(beam["steps"])] += 1
            else:
                not_ended += 1
    separator = tokenizer("\n\n", add_special_tokens=False)["input_ids"]
    if len(separator) != 1:
        raise ValueError(f"{model}'s tokenizer has no single token for the step delimiter")
    in_prompt = tokenizer("a.\n\nb", add_special_tokens=False)["input_ids"][2:-1]
    turn = tokenizer.convert_tokens_to_ids("<|im_start|>") if "<|im_start|>" in tokenizer.get_vocab() else None
    kept = [t for t, _ in ordinary.most_common() if "\n" not in tokenizer.decode([t])
            and t not in tokenizer.all_special_ids][:_ORDINARY_TOKENS]
    return SimProfile(model, str(results), dict(sorted(lengths.items())), dict(sorted(steps_per_beam.items())),
                      not_ended, separator[0], tokenizer.eos_token_id, turn,
                      sorted({tuple(separator), tuple(in_prompt)}, key=len), kept)


def main() -> None:
    parser = argparse.ArgumentParser(description="Record a simulated generator's profile from a run.")
    parser.add_argument("results", type=Path, help="a run folder's results.jsonl")
    parser.add_argument("--model", default=DEFAULT_GENERATOR, help="the run's generator")
    parser.add_argument("--out", type=Path, default=DEFAULT_PROFILE)
    args = parser.parse_args()
    from tts_runtime.models.loader import load_tokenizer, model_folder

    folder = model_folder(args.model)
    if folder is None:
        raise SystemExit(f"{args.model} has no tokenizer here (dummy weights)")
    profile = record_profile(args.results, load_tokenizer(folder), args.model)
    args.out.write_text(json.dumps(profile.to_json(), indent=1) + "\n")
    steps = sum(profile.step_lengths.values())
    mean = sum(k * c for k, c in profile.step_lengths.items()) / steps
    print(f"{args.out}: {steps} steps, mean {mean:.1f} tokens; "
          f"{sum(profile.steps_per_beam.values())} beams ended with EOS, {profile.beams_not_ended} did not")


if __name__ == "__main__":
    main()

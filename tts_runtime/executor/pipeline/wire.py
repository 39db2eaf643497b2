"""The pipeline's messages on the wire: a msgpack header with a fixed schema per message
kind, and each tensor's bytes as a frame of its own (no copy on the sending side).

Nothing is unpickled: a message whose kind, fields, field types or tensor descriptions
are not the schema's is refused with `WireError` before any of it is used, so a peer
can at worst send wrong numbers, never run code in the receiver.

Header: {"kind": name, field: value, ...}; a tensor field holds {"frame": i, "dtype":
name, "shape": [...]} and its bytes are frame i (1-based: frame 0 is the header).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import torch
import zmq

from tts_runtime.executor.batch import AttentionMetadata, ModelInput, ModelOutput, SamplePlan
from tts_runtime.executor.pipeline.stage_messages import (Activation, Launch, Ready, Shutdown, StageFailure,
                                                          StageResult, TraceDump, TraceRequest)
from tts_runtime.executor.sampler import SamplingRow

_DTYPES = {str(dtype).removeprefix("torch."): dtype for dtype in
           (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.uint8, torch.bool)}


class WireError(ValueError):
    """A message that is not in the pipeline's schema."""


@dataclass(frozen=True)
class WireSamplingParams:
    """What the sampler reads of a request's sampling settings (sampler.SamplingParams), as
    plain values: the stage need not know the engine's request type."""

    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    greedy: bool
    uses_penalties: bool


# -- encoding -----------------------------------------------------------------------------
class _Encoder:
    def __init__(self) -> None:
        self.frames: list[Any] = [b""]

    def tensor(self, value: torch.Tensor) -> dict:
        host = value.detach().to("cpu").contiguous()
        # Bytes through a uint8 view: numpy has no bfloat16.
        self.frames.append(memoryview(host.reshape(-1).view(torch.uint8).numpy()))
        return {"frame": len(self.frames) - 1, "dtype": str(host.dtype).removeprefix("torch."),
                "shape": list(host.shape)}

    def batch(self, batch: ModelInput) -> dict:
        meta = batch.meta
        return {"input_ids": self.tensor(batch.input_ids), "positions": self.tensor(batch.positions),
                "slot_mapping": self.tensor(meta.slot_mapping), "num_decodes": meta.num_decodes,
                "decode_block_tables": self.tensor(meta.decode_block_tables),
                "decode_context_lens": self.tensor(meta.decode_context_lens),
                "prefill_query_starts": list(meta.prefill_query_starts),
                "prefill_query_lens": list(meta.prefill_query_lens),
                "prefill_context_lens": list(meta.prefill_context_lens),
                "prefill_block_tables": self.tensor(meta.prefill_block_tables), "block_size": meta.block_size,
                "sample_rows": self.tensor(batch.sample_rows),
                "score_rows": [[self.tensor(rows), self.tensor(ids)] for rows, ids in batch.score_rows],
                "block_copies": None if batch.block_copies is None else self.tensor(batch.block_copies)}


def _params(params) -> list:
    return [float(params.temperature), int(params.top_k), float(params.top_p), float(params.min_p),
            float(params.repetition_penalty), float(params.presence_penalty), float(params.frequency_penalty),
            bool(params.greedy), bool(params.uses_penalties)]


def _plan(plan: SamplePlan | None) -> dict | None:
    if plan is None:
        return None
    return {"logit_rows": list(plan.logit_rows),
            "rows": [[_params(r.params), r.tokens(), r.num_prompt_tokens, r.seed] for r in plan.rows]}


def encode(message: object) -> list[Any]:
    """The frames of `message` (one of stage_messages' wire kinds)."""
    out = _Encoder()
    if isinstance(message, Launch):
        header = {"kind": "launch", "microbatch": message.microbatch, "model": message.model,
                  "batch": out.batch(message.batch), "sample_plan": _plan(message.sample_plan)}
    elif isinstance(message, StageResult):
        output = message.output
        header = {"kind": "result", "microbatch": message.microbatch,
                  "sample_logits": out.tensor(output.sample_logits),
                  "score_logits": [out.tensor(t) for t in output.score_logits],
                  "sampled_tokens": None if output.sampled_tokens is None else list(output.sampled_tokens)}
    elif isinstance(message, Activation):
        header = {"kind": "activation", "microbatch": message.microbatch, "hidden": out.tensor(message.hidden)}
    elif isinstance(message, Ready):
        header = {"kind": "ready", "stage": message.stage, "pid": message.pid}
    elif isinstance(message, TraceDump):
        header = {"kind": "trace", "stage": message.stage, "events": [list(e) for e in message.events]}
    elif isinstance(message, StageFailure):
        header = {"kind": "failure", "stage": message.stage, "pid": message.pid, "traceback": message.traceback}
    elif isinstance(message, TraceRequest):
        header = {"kind": "trace_request"}
    elif isinstance(message, Shutdown):
        header = {"kind": "shutdown"}
    else:
        raise TypeError(f"{type(message).__name__} is not a pipeline message")
    out.frames[0] = msgpack.packb(header, use_bin_type=True)
    return out.frames


# -- decoding: every value checked against the schema --------------------------------------
def _expect(value: Any, kind: type | tuple[type, ...], what: str) -> Any:
    # bool is an int subclass; an int field must not take one (and vice versa).
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise WireError(f"{what} is {type(value).__name__}, not {getattr(kind, '__name__', kind)}")
    return value


def _ints(value: Any, what: str) -> list[int]:
    return [_expect(v, int, what) for v in _expect(value, list, what)]


def _number(value: Any, what: str) -> float:
    return float(_expect(value, (int, float), what))


class _Decoder:
    def __init__(self, frames: Sequence[Any]) -> None:
        self.frames = frames

    def tensor(self, value: Any, what: str) -> torch.Tensor:
        spec = _expect(value, dict, what)
        if set(spec) != {"frame", "dtype", "shape"}:
            raise WireError(f"{what} is not a tensor description")
        index = _expect(spec["frame"], int, what)
        dtype = _DTYPES.get(spec["dtype"]) if isinstance(spec["dtype"], str) else None
        shape = _ints(spec["shape"], what)
        if dtype is None or not 1 <= index < len(self.frames) or any(n < 0 for n in shape):
            raise WireError(f"{what}: bad tensor description {spec}")
        data = memoryview(self.frames[index])
        numel = 1
        for n in shape:
            numel *= n
        if data.nbytes != numel * torch.empty((), dtype=dtype).element_size():
            raise WireError(f"{what}: {data.nbytes} bytes for a {dtype} tensor of shape {shape}")
        if numel == 0:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)

    def batch(self, value: Any) -> ModelInput:
        b = _fields(value, _BATCH_FIELDS, "batch")
        meta = AttentionMetadata(
            slot_mapping=self.tensor(b["slot_mapping"], "slot_mapping"),
            num_decodes=_expect(b["num_decodes"], int, "num_decodes"),
            decode_block_tables=self.tensor(b["decode_block_tables"], "decode_block_tables"),
            decode_context_lens=self.tensor(b["decode_context_lens"], "decode_context_lens"),
            prefill_query_starts=_ints(b["prefill_query_starts"], "prefill_query_starts"),
            prefill_query_lens=_ints(b["prefill_query_lens"], "prefill_query_lens"),
            prefill_context_lens=_ints(b["prefill_context_lens"], "prefill_context_lens"),
            prefill_block_tables=self.tensor(b["prefill_block_tables"], "prefill_block_tables"),
            block_size=_expect(b["block_size"], int, "block_size"))
        score_rows = []
        for pair in _expect(b["score_rows"], list, "score_rows"):
            if not isinstance(pair, list) or len(pair) != 2:
                _bad("score_rows entry")
            score_rows.append((self.tensor(pair[0], "score rows"), self.tensor(pair[1], "score candidates")))
        copies = b["block_copies"]
        return ModelInput(self.tensor(b["input_ids"], "input_ids"), self.tensor(b["positions"], "positions"), meta,
                          self.tensor(b["sample_rows"], "sample_rows"), score_rows,
                          block_copies=None if copies is None else self.tensor(copies, "block_copies"))


def _bad(what: str):
    raise WireError(f"{what} does not fit the schema")


_BATCH_FIELDS = {"input_ids", "positions", "slot_mapping", "num_decodes", "decode_block_tables",
                 "decode_context_lens", "prefill_query_starts", "prefill_query_lens", "prefill_context_lens",
                 "prefill_block_tables", "block_size", "sample_rows", "score_rows", "block_copies"}


def _fields(value: Any, names: set[str], what: str) -> dict:
    fields = _expect(value, dict, what)
    if set(fields) != names:
        raise WireError(f"{what} has fields {sorted(map(str, fields))}, expected {sorted(names)}")
    return fields


def _sampling_params(value: Any) -> WireSamplingParams:
    items = _expect(value, list, "sampling params")
    if len(items) != 9:
        _bad("sampling params")
    numbers = [_number(v, "sampling param") for v in items[:7]]
    return WireSamplingParams(numbers[0], int(_expect(items[1], int, "top_k")), numbers[2], numbers[3], numbers[4],
                              numbers[5], numbers[6], _expect(items[7], bool, "greedy"),
                              _expect(items[8], bool, "uses_penalties"))


def _sample_plan(value: Any) -> SamplePlan | None:
    if value is None:
        return None
    plan = _fields(value, {"logit_rows", "rows"}, "sample plan")
    rows = []
    for row in _expect(plan["rows"], list, "sample rows"):
        if not isinstance(row, list) or len(row) != 4:
            _bad("sample row")
        seed = None if row[3] is None else _expect(row[3], int, "seed")
        tokens = _ints(row[1], "token ids")
        rows.append(SamplingRow(_sampling_params(row[0]), tokens, _expect(row[2], int, "prompt tokens"), seed,
                                len(tokens)))
    return SamplePlan(_ints(plan["logit_rows"], "logit rows"), rows)


def _events(value: Any) -> list[tuple[str, int, int, float, float]]:
    events = []
    for event in _expect(value, list, "trace events"):
        if not isinstance(event, list) or len(event) != 5:
            _bad("trace event")
        events.append((_expect(event[0], str, "event"), _expect(event[1], int, "event microbatch"),
                       _expect(event[2], int, "event version"), _number(event[3], "event start"),
                       _number(event[4], "event end")))
    return events


def _launch(h: dict, d: _Decoder) -> Launch:
    return Launch(_expect(h["microbatch"], int, "microbatch"), _expect(h["model"], str, "model"),
                  d.batch(h["batch"]), _sample_plan(h["sample_plan"]))


def _result(h: dict, d: _Decoder) -> StageResult:
    tokens = h["sampled_tokens"]
    scores = [d.tensor(t, "score logits") for t in _expect(h["score_logits"], list, "score logits")]
    output = ModelOutput(d.tensor(h["sample_logits"], "sample logits"), scores,
                         None if tokens is None else _ints(tokens, "sampled tokens"))
    return StageResult(_expect(h["microbatch"], int, "microbatch"), output)


_KINDS: dict[str, tuple[set[str], Callable[[dict, _Decoder], object]]] = {
    "launch": ({"microbatch", "model", "batch", "sample_plan"}, _launch),
    "result": ({"microbatch", "sample_logits", "score_logits", "sampled_tokens"}, _result),
    "activation": ({"microbatch", "hidden"}, lambda h, d: Activation(_expect(h["microbatch"], int, "microbatch"),
                                                                     d.tensor(h["hidden"], "hidden"))),
    "ready": ({"stage", "pid"}, lambda h, d: Ready(_expect(h["stage"], int, "stage"), _expect(h["pid"], int, "pid"))),
    "trace": ({"stage", "events"}, lambda h, d: TraceDump(_expect(h["stage"], int, "stage"), _events(h["events"]))),
    "failure": ({"stage", "pid", "traceback"},
                lambda h, d: StageFailure(_expect(h["stage"], int, "stage"), _expect(h["pid"], int, "pid"),
                                          _expect(h["traceback"], str, "traceback"))),
    "trace_request": (set(), lambda h, d: TraceRequest()),
    "shutdown": (set(), lambda h, d: Shutdown()),
}


def decode(frames: Sequence[Any]) -> object:
    """The message in `frames`, or WireError when they are not one of the schema's."""
    if not frames:
        raise WireError("an empty message")
    try:
        header = msgpack.unpackb(frames[0], raw=False, strict_map_key=True, use_list=True)
    except Exception as error:  # msgpack raises several types for bytes that are not msgpack
        raise WireError(f"a message that is not msgpack ({type(error).__name__})") from None
    kind = header.get("kind") if isinstance(header, dict) else None
    if kind not in _KINDS:
        raise WireError(f"a message of unknown kind {kind!r}" if isinstance(header, dict)
                        else "a message whose header is not a map")
    names, build = _KINDS[kind]
    _fields({k: v for k, v in header.items() if k != "kind"}, names, f"a {kind} message")
    try:
        return build(header, _Decoder(frames))
    except (TypeError, RuntimeError) as error:  # e.g. a list where a score pair should be
        raise WireError(f"a {kind} message that does not fit the schema: {error}") from None


# -- sockets: no send or receive waits on a peer that is gone -------------------------------
def send(socket: zmq.Socket, frames: list[Any], check: Callable[[], None], poll_ms: int) -> None:
    """Send `frames` as one message; while the peer cannot take it (a PUSH socket whose
    peer died has nowhere to send and would block for ever), call `check` every `poll_ms`:
    it raises once the peer is known to be gone."""
    while True:
        try:
            socket.send_multipart(frames, flags=zmq.NOBLOCK)
            return
        except zmq.Again:
            if not socket.poll(poll_ms, zmq.POLLOUT):
                check()


def receive(socket: zmq.Socket, check: Callable[[], None], poll_ms: int) -> object:
    """The next message, decoded (WireError if it is not the schema's); `check` as in send."""
    while not socket.poll(poll_ms):
        check()
    return decode([frame.buffer for frame in socket.recv_multipart(copy=False)])

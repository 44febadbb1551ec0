"""Text generation: the checks on a request's arguments, and the streams that hand a
generation's chunks to Python as they arrive.

Each stream runs its generation (the C++ ``Client::Generate``, which checks every chunk before
it is used) on a thread of its own with the GIL released; the chunk callback takes the GIL for
a moment to put each chunk on the stream's queue, and the consumer takes them off: a
``queue.SimpleQueue`` for :class:`GenerateStream`, an ``asyncio.Queue`` filled through
``loop.call_soon_threadsafe`` for :class:`AsyncGenerateStream`. A stream belongs to one consumer.

Closing a stream early stops the deliveries at once and the generation after its next chunk
(the call is cancelled, and with it the sequence in the enclave); what arrives meanwhile is
dropped without taking the GIL. The thread is not a daemon (a daemon thread that comes back into
Python while the interpreter shuts down would be killed inside C++), so a program that exits
while a closed stream is still running waits for that chunk.
"""

from __future__ import annotations

import asyncio
import math
import numbers
import queue
import threading
from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple, Union

from . import _native
from .errors import InvalidArgument
from .types import GenerateChunk, GenerateResult

__all__ = ["GenerateStream", "AsyncGenerateStream"]

# As enclave/llm/sampler.h kMaxTopLogprobs.
MAX_TOP_LOGPROBS = 20
_MAX_TOKEN_ID = 2**31 - 1
_MAX_UINT64 = 2**64 - 1

Messages = Sequence[Mapping[str, str]]


def _is_whole(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _whole(name: str, value: Any, low: int, high: int, what: str) -> int:
    if not _is_whole(value) or not low <= value <= high:
        raise InvalidArgument(f"{name} must be {what}, not {value!r}")
    return int(value)


def _messages(messages: Any) -> List[Tuple[str, str]]:
    shape = 'a list of {"role": ..., "content": ...} messages'
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise InvalidArgument(f"messages must be {shape}, not {type(messages).__name__}")
    if not messages:
        raise InvalidArgument(f"messages must be {shape} (it is an empty list)")
    pairs = []
    for i, message in enumerate(messages, 1):
        if not isinstance(message, Mapping):
            raise InvalidArgument(f"message {i} is not a mapping ({shape})")
        unknown = sorted(str(k) for k in message if k not in ("role", "content"))
        if unknown:
            raise InvalidArgument(
                f"message {i} has an unknown key {unknown[0]!r} (a message has role and content)")
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not role:
            raise InvalidArgument(f"message {i} has no role (a non-empty string)")
        if not isinstance(content, str):
            raise InvalidArgument(f"message {i} has no content (a string)")
        pairs.append((role, content))
    return pairs


def _prompt_ids(prompt_ids: Any) -> List[int]:
    if isinstance(prompt_ids, (str, bytes)):
        raise InvalidArgument("prompt_ids must be a list of token ids, not a string")
    try:
        ids = list(prompt_ids)
    except TypeError:
        raise InvalidArgument(
            f"prompt_ids must be a list of token ids, not {type(prompt_ids).__name__}") from None
    if not ids:
        raise InvalidArgument("prompt_ids is empty")
    for i, token in enumerate(ids):
        if not _is_whole(token) or not 0 <= token <= _MAX_TOKEN_ID:
            raise InvalidArgument(
                f"prompt_ids must hold token ids from 0 to {_MAX_TOKEN_ID}; "
                f"item {i} is {token!r}")
    return [int(token) for token in ids]


def _stop(stop: Any) -> List[str]:
    if stop is None:
        return []
    strings = [stop] if isinstance(stop, str) else stop
    if isinstance(strings, (bytes, Mapping)) or not isinstance(strings, Sequence):
        raise InvalidArgument(f"stop must be a string or a list of strings, not {stop!r}")
    for string in strings:
        if not isinstance(string, str) or not string:
            raise InvalidArgument(f"stop strings must be non-empty strings, not {string!r}")
    return list(strings)


def make_args(
    prompt: Optional[str],
    messages: Optional[Messages],
    prompt_ids: Optional[Sequence[int]],
    max_tokens: Optional[int],
    temperature: Optional[float],
    top_p: Optional[float],
    top_k: int,
    seed: Optional[int],
    stop: Union[str, Sequence[str], None],
    logprobs: bool,
    top_logprobs: int,
    ignore_eos: bool,
    *,
    min_p: float = 0.0,
    repetition_penalty: Optional[float] = None,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
    pad_to: int = 0,
    tokens_per_chunk: int = 0,
    interval_ms: int = 0,
) -> "_native.GenerateArgs":
    """The native request, after checking every argument (InvalidArgument, a ValueError, with
    one line that names the argument)."""
    given = [name for name, value in (("prompt", prompt), ("messages", messages),
                                      ("prompt_ids", prompt_ids)) if value is not None]
    if not given:
        raise InvalidArgument(
            "a generation needs a prompt: prompt= (text), messages= (a chat) or prompt_ids= "
            "(token ids)")
    if len(given) > 1:
        raise InvalidArgument(
            f"give exactly one of prompt=, messages= and prompt_ids=, not {' and '.join(given)}")
    args = _native.GenerateArgs()
    if prompt is not None:
        if not isinstance(prompt, str):
            raise InvalidArgument(f"prompt must be a string, not {type(prompt).__name__}")
        args.text = prompt
    elif messages is not None:
        args.messages = _messages(messages)
    else:
        args.ids = _prompt_ids(prompt_ids)

    if max_tokens is not None:
        args.max_tokens = _whole(
            "max_tokens", max_tokens, 1, _MAX_UINT64,
            "a whole number of tokens from 1 (None: up to the model's context)")
    if temperature is not None:
        if not _is_number(temperature) or not 0 <= temperature <= 2:
            raise InvalidArgument(f"temperature must be a number in [0, 2], not {temperature!r}")
        args.temperature = float(temperature)
    if top_p is not None:
        if not _is_number(top_p) or not 0 < top_p <= 1:
            raise InvalidArgument(f"top_p must be a number in (0, 1], not {top_p!r}")
        args.top_p = float(top_p)
    args.top_k = _whole("top_k", top_k, 0, _MAX_TOKEN_ID, "a whole number from 0 (0: off)")
    if seed is not None:
        args.seed = _whole("seed", seed, 0, _MAX_UINT64, f"a whole number from 0 to {_MAX_UINT64}")
    args.stop = _stop(stop)
    if not isinstance(logprobs, bool):
        raise InvalidArgument(f"logprobs must be True or False, not {logprobs!r}")
    args.logprobs = logprobs
    args.top_logprobs = _whole("top_logprobs", top_logprobs, 0, MAX_TOP_LOGPROBS,
                               f"a whole number from 0 to {MAX_TOP_LOGPROBS}")
    if args.top_logprobs and not logprobs:
        raise InvalidArgument(f"top_logprobs={top_logprobs} needs logprobs=True")
    if not isinstance(ignore_eos, bool):
        raise InvalidArgument(f"ignore_eos must be True or False, not {ignore_eos!r}")
    args.ignore_eos = ignore_eos
    if not _is_number(min_p) or not 0 <= min_p <= 1:
        raise InvalidArgument(f"min_p must be a number in [0, 1], not {min_p!r}")
    args.min_p = float(min_p)
    if repetition_penalty is not None:
        if not _is_number(repetition_penalty) or not repetition_penalty > 0:
            raise InvalidArgument(
                f"repetition_penalty must be a number above 0, not {repetition_penalty!r}")
        args.repetition_penalty = float(repetition_penalty)
    for name, value in (("presence_penalty", presence_penalty),
                        ("frequency_penalty", frequency_penalty)):
        if not _is_number(value) or not -2 <= value <= 2:
            raise InvalidArgument(f"{name} must be a number in [-2, 2], not {value!r}")
    args.presence_penalty = float(presence_penalty)
    args.frequency_penalty = float(frequency_penalty)
    args.pad_to = _whole("pad_to", pad_to, 0, 65536,
                         "a whole number of bytes from 0 to 65536 (0: 256; 1: no padding)")
    args.tokens_per_chunk = _whole("tokens_per_chunk", tokens_per_chunk, 0, 4096,
                                   "a whole number from 0 to 4096 (0 or 1: every token)")
    if not _is_whole(interval_ms) or not (interval_ms == 0 or 10 <= interval_ms <= 10000):
        raise InvalidArgument(
            f"interval_ms must be 0 (no cadence) or a whole number from 10 to 10000, not "
            f"{interval_ms!r}")
    args.interval_ms = int(interval_ms)
    return args


# What a stream's thread hands its consumer: (kind, value).
_CHUNK, _END, _ERROR = "chunk", "end", "error"
Item = Tuple[str, Any]


def _run(generation: "_native.NativeGeneration", deliver: Callable[[Item], None]) -> None:
    """The body of a stream's thread: runs the generation, delivering each chunk (as the native
    tuple), then its result or its exception."""
    try:
        result = generation.run(lambda chunk: deliver((_CHUNK, chunk)))
    except BaseException as error:  # noqa: BLE001 - handed to the consumer
        deliver((_ERROR, error))
    else:
        deliver((_END, result))


def _start(generation: "_native.NativeGeneration", deliver: Callable[[Item], None]) -> None:
    threading.Thread(target=_run, args=(generation, deliver), name="cloister-generate").start()


class _Stream:
    """What the two streams share: the generation, its result and closing.

    Attributes:
        result: the whole :class:`GenerateResult` once the last chunk has been handed over;
            ``None`` before, and for a stream that failed or was closed early.
    """

    def __init__(self, generation: "_native.NativeGeneration") -> None:
        self._generation = generation
        self._started = False
        self._done = False
        self.result: Optional[GenerateResult] = None

    def _take(self, item: Item) -> GenerateChunk:
        kind, value = item
        if kind == _CHUNK:
            return GenerateChunk._from_native(value)
        self._done = True
        if kind == _ERROR:
            raise value
        self.result = GenerateResult._from_native(value)
        raise _Ended

    def close(self) -> None:
        """Stops handing chunks to this stream; iterating further ends at once. The generation
        itself stops after its next chunk (the call is cancelled, and with it the sequence in
        the enclave)."""
        if not self._done:
            self._done = True
            self._generation.stop()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit the module may be gone
            pass


class _Ended(Exception):
    """The stream's result arrived (turned into StopIteration or StopAsyncIteration)."""


class GenerateStream(_Stream):
    """The chunks of one generation, as they arrive: iterate over it (``for chunk in stream``).

    The generation starts when the first chunk is asked for. Every chunk passed the client's
    checks before it is handed over; the last one carries ``finish_reason``, ``usage`` and the
    receipt, and then :attr:`result` holds the whole generation. A failure (the enclave's
    refusal, a stream that fails the checks, a timeout) is raised by the iteration that reaches
    it, after the chunks that came before it, as the same :class:`cloister.Error` subclasses
    :meth:`Client.infer` raises. :meth:`close` (or leaving a ``with`` block, or ``break`` and
    dropping the stream) stops the deliveries.
    """

    def __init__(self, generation: "_native.NativeGeneration") -> None:
        super().__init__(generation)
        self._queue: "queue.SimpleQueue[Item]" = queue.SimpleQueue()

    def __iter__(self) -> "GenerateStream":
        return self

    def __next__(self) -> GenerateChunk:
        if self._done:
            raise StopIteration
        if not self._started:
            self._started = True
            _start(self._generation, self._queue.put)
        try:
            return self._take(self._queue.get())
        except _Ended:
            raise StopIteration from None

    def __enter__(self) -> "GenerateStream":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class AsyncGenerateStream(_Stream):
    """:class:`GenerateStream` for asyncio: ``async for chunk in client.agenerate(...)``.

    The generation starts when the first chunk is awaited, and its chunks come into the
    running event loop through ``loop.call_soon_threadsafe``; the loop is never blocked.
    :meth:`aclose` (or ``async with``) stops the deliveries.
    """

    def __init__(self, generation: "_native.NativeGeneration") -> None:
        super().__init__(generation)
        self._queue: "Optional[asyncio.Queue[Item]]" = None

    def __aiter__(self) -> "AsyncGenerateStream":
        return self

    async def __anext__(self) -> GenerateChunk:
        if self._done:
            raise StopAsyncIteration
        if not self._started:
            self._started = True
            loop = asyncio.get_running_loop()
            self._queue = asyncio.Queue()
            put = self._queue.put_nowait
            generation = self._generation

            def deliver(item: Item) -> None:
                try:
                    loop.call_soon_threadsafe(put, item)
                except RuntimeError:  # the loop is closed: nobody is listening any more
                    generation.stop()

            _start(generation, deliver)
        assert self._queue is not None
        try:
            return self._take(await self._queue.get())
        except _Ended:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        self.close()

    async def __aenter__(self) -> "AsyncGenerateStream":
        return self

    async def __aexit__(self, *exc_info) -> None:
        self.close()

"""Text generation from Python against the real appliance, with the shared tiny LLM uploaded
from its checkpoint folder: greedy streams give the offline engine's ids (cloister-llm, which
runs the same engine outside any enclave) and the reference chats' ids; chunks come as a
stream, with log-probabilities when asked; asyncio streams; early close; every refusal as the
exception class infer raises; a stream tampered with on the way is refused; bad arguments
raise InvalidArgument (a ValueError) with one line that names the argument."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import cloister
from conftest import shared_dir

LLM = "gen-tiny-llama"
PROMPT = "The meaning of life"


def tiny_llama() -> Path:
    return shared_dir() / "models" / "llm" / "tiny-llama"


@pytest.fixture(scope="session")
def references():
    return json.loads((tiny_llama() / "reference.json").read_text())


@pytest.fixture(scope="session")
def llm(client) -> str:
    if not any(model.name == LLM for model in client.models()):
        info = client.upload_model(tiny_llama(), LLM)
        assert info.kind == "llm"
    return LLM


def offline_engine(*args: str) -> dict:
    """cloister-llm run --json: the same engine, run in this process's sandbox, no enclave."""
    build = os.environ.get("CLOISTER_BUILD_DIR")
    if not build:
        pytest.fail("CLOISTER_BUILD_DIR is not set; run these tests through ctest (label python)")
    ran = subprocess.run([str(Path(build) / "bin" / "cloister-llm"), "run", "--model",
                          str(tiny_llama()), "--json", *args],
                         capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout)


def generation_threads() -> list:
    return [t for t in threading.enumerate() if t.name == "cloister-generate"]


def wait_for_generation_threads(timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while generation_threads() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not generation_threads(), "a generation thread did not end"


def test_a_greedy_stream_gives_the_offline_engines_ids(client, llm):
    expected = offline_engine("--prompt", PROMPT, "--max-tokens", "16")
    stream = client.generate(llm, PROMPT, temperature=0, max_tokens=16)
    assert isinstance(stream, cloister.GenerateStream)
    chunks = list(stream)

    assert [i for chunk in chunks for i in chunk.token_ids] == expected["ids"]
    assert "".join(chunk.text for chunk in chunks) == expected["text"]
    assert len(chunks) > 1, "the tokens came in one piece, not as a stream"
    assert all(not chunk.final for chunk in chunks[:-1])
    assert all(c.usage is None and c.receipt is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.final and last.finish_reason == expected["finish_reason"] == "length"
    assert last.usage == cloister.Usage(prompt_tokens=len(expected["prompt_ids"]),
                                        cached_tokens=last.usage.cached_tokens,
                                        completion_tokens=16)
    assert isinstance(last.receipt, bytes) and last.receipt
    assert isinstance(last.receipt_signature, bytes) and len(last.receipt_signature) == 64
    assert all(chunk.logprobs is None and chunk.top_logprobs is None for chunk in chunks)

    # The whole of it, as the C++ client put it together.
    result = stream.result
    assert isinstance(result, cloister.GenerateResult)
    assert result.ids == expected["ids"] and result.text == expected["text"]
    assert result.finish_reason == "length" and result.usage == last.usage
    assert result.receipt == last.receipt and result.chunk_count == len(chunks)
    # An ended stream stays ended.
    assert next(stream, None) is None

    # The same request without streaming, and from the prompt's ids.
    text = client.generate_text(llm, PROMPT, temperature=0, max_tokens=16)
    assert text.ids == expected["ids"] and text.text == expected["text"]
    by_ids = client.generate_text(llm, prompt_ids=expected["prompt_ids"], temperature=0,
                                  max_tokens=16)
    assert by_ids.ids == expected["ids"]


def test_chats_give_the_reference_ids(client, llm, references):
    max_tokens = references["generation"]["max_new_tokens"]
    chats = [p for p in references["prompts"] if p["kind"] == "chat"]
    assert chats
    for prompt in chats:
        chunks = list(client.chat(llm, prompt["messages"], temperature=0, max_tokens=max_tokens))
        ids = [i for chunk in chunks for i in chunk.token_ids]
        assert ids == prompt["generated_ids"], prompt["name"]
        assert chunks[-1].finish_reason == ("stop" if prompt["stop"] == "eos" else "length")
        assert chunks[-1].usage.prompt_tokens == len(prompt["prompt_ids"])
        result = client.generate_text(llm, messages=prompt["messages"], temperature=0,
                                      max_tokens=max_tokens)
        assert result.ids == prompt["generated_ids"]
        assert result.text == prompt["generated_text"], prompt["name"]


def test_logprobs_come_with_each_token_when_asked(client, llm):
    expected = offline_engine("--prompt", PROMPT, "--max-tokens", "6", "--top-logprobs", "3")
    chunks = list(client.generate(llm, PROMPT, temperature=0, max_tokens=6, logprobs=True,
                                  top_logprobs=3))
    logprobs = [lp for chunk in chunks for lp in chunk.logprobs]
    top = [alternatives for chunk in chunks for alternatives in chunk.top_logprobs]
    assert len(logprobs) == len(top) == 6
    for token, logprob, alternatives in zip(expected["logprobs"], logprobs, top):
        assert logprob == pytest.approx(token["logprob"], abs=1e-4)
        assert [a.id for a in alternatives] == [t["id"] for t in token["top"]]
        assert [a.logprob for a in alternatives] == pytest.approx(
            [t["logprob"] for t in token["top"]], abs=1e-4)
        assert isinstance(alternatives[0], cloister.TokenLogprob)
    # Only the chosen token's, without alternatives.
    only = list(client.generate(llm, PROMPT, temperature=0, max_tokens=3, logprobs=True))
    assert all(c.top_logprobs is None and len(c.logprobs) == len(c.token_ids) for c in only)


def test_a_stop_string_ends_the_text_before_it(client, llm):
    full = offline_engine("--prompt", PROMPT, "--max-tokens", "16")["text"]
    assert " good " in full
    result = client.generate_text(llm, PROMPT, temperature=0, max_tokens=16, stop="good")
    assert result.finish_reason == "stop"
    assert result.text == full[:full.index("good")]
    assert client.generate_text(llm, PROMPT, temperature=0, max_tokens=16,
                                stop=["never there", "good"]).text == result.text


def test_shape_options_keep_the_ids(client, llm, references):
    # Tokens grouped, chunks padded, and a fixed cadence: the same greedy ids, fewer chunks.
    case = next(p for p in references["prompts"] if p["kind"] != "chat")
    ids = case["generated_ids"]
    grouped = list(client.generate(llm, prompt_ids=case["prompt_ids"], temperature=0,
                                   max_tokens=len(ids), tokens_per_chunk=4, pad_to=64))
    assert [t for chunk in grouped for t in chunk.token_ids] == ids
    assert len(grouped) == (len(ids) + 3) // 4
    paced = list(client.generate(llm, prompt_ids=case["prompt_ids"], temperature=0,
                                 max_tokens=len(ids), interval_ms=30))
    assert [t for chunk in paced for t in chunk.token_ids] == ids


def test_penalties_change_a_greedy_answer(client, llm, references):
    case = next(p for p in references["prompts"] if p["kind"] != "chat")
    plain = client.generate_text(llm, prompt_ids=case["prompt_ids"], temperature=0,
                                 max_tokens=24, ignore_eos=True)
    penalised = client.generate_text(llm, prompt_ids=case["prompt_ids"], temperature=0,
                                     max_tokens=24, ignore_eos=True, frequency_penalty=2.0,
                                     presence_penalty=2.0, repetition_penalty=1.5)
    n = min(24, len(case["generated_ids"]))
    assert plain.ids[:n] == case["generated_ids"][:n]
    assert penalised.ids != plain.ids


def test_a_seeded_sample_repeats(client, llm):
    first = client.generate_text(llm, PROMPT, temperature=1.0, top_p=0.9, top_k=50, seed=7,
                                 max_tokens=12, ignore_eos=True)
    again = client.generate_text(llm, PROMPT, temperature=1.0, top_p=0.9, top_k=50, seed=7,
                                 max_tokens=12, ignore_eos=True)
    assert first.ids == again.ids and len(first.ids) == 12


def test_closing_a_stream_early_stops_its_chunks(client, llm, references):
    stream = client.generate(llm, PROMPT, temperature=0, max_tokens=400, ignore_eos=True)
    first = next(stream)
    assert first.token_ids and not first.final
    stream.close()
    assert list(stream) == []  # nothing more is handed over
    assert stream.result is None
    # break out of a for loop and drop the stream: the same.
    with client.generate(llm, PROMPT, temperature=0, max_tokens=400, ignore_eos=True) as other:
        for _ in other:
            break
    # The generations run on to their end in the background, then their threads end.
    wait_for_generation_threads()
    # A stream never iterated never starts.
    client.generate(llm, PROMPT, max_tokens=400).close()
    assert not generation_threads()
    # And the client goes on as before.
    plain = next(p for p in references["prompts"] if p["kind"] == "plain")
    again = client.generate_text(llm, prompt_ids=plain["prompt_ids"], temperature=0,
                                 max_tokens=references["generation"]["max_new_tokens"])
    assert again.ids == plain["generated_ids"]


def test_a_program_that_leaves_streams_open_exits_cleanly(appliance, key, llm):
    program = """
import asyncio, sys, cloister
client = cloister.connect(sys.argv[1], policy=sys.argv[2], tenant="demo", token=sys.argv[3],
                          key=sys.argv[4])
left_open = client.generate(sys.argv[5], "x", max_tokens=400, ignore_eos=True)
assert next(left_open).token_ids
async def main():
    async for chunk in client.agenerate(sys.argv[5], "x", max_tokens=400, ignore_eos=True):
        return chunk
assert asyncio.run(main()).token_ids   # the loop closes with the stream still running
print("done")
"""
    ran = subprocess.run([sys.executable, "-c", program, appliance.address, str(appliance.policy),
                          appliance.token, str(key), llm],
                         capture_output=True, text=True, timeout=120)
    assert (ran.returncode, ran.stdout, ran.stderr) == (0, "done\n", "")


def test_asyncio_streams(client, llm, references):
    max_tokens = references["generation"]["max_new_tokens"]
    prompts = references["prompts"][:4]

    async def collect(prompt):
        if prompt["kind"] == "chat":
            stream = client.agenerate(llm, messages=prompt["messages"], temperature=0,
                                      max_tokens=max_tokens)
        else:
            stream = client.agenerate(llm, prompt_ids=prompt["prompt_ids"], temperature=0,
                                      max_tokens=max_tokens)
        assert isinstance(stream, cloister.AsyncGenerateStream)
        chunks = [chunk async for chunk in stream]
        assert stream.result is not None and stream.result.chunk_count == len(chunks)
        return [i for chunk in chunks for i in chunk.token_ids]

    async def ticker(stop: asyncio.Event) -> int:
        ticks = 0
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0)
        return ticks

    async def main():
        stop = asyncio.Event()
        ticks = asyncio.ensure_future(ticker(stop))
        results = await asyncio.gather(*(collect(p) for p in prompts))
        stop.set()
        # The loop ran other work while the streams were in flight.
        assert await ticks > len(prompts)

        # An async stream closed early.
        async with client.agenerate(llm, PROMPT, max_tokens=400, ignore_eos=True) as stream:
            async for chunk in stream:
                assert chunk.token_ids
                break
        assert [c async for c in stream] == []

        # Its failures are raised in the loop.
        with pytest.raises(cloister.NotFound):
            async for _ in client.agenerate("no-such-llm", PROMPT):
                pass
        return results

    results = asyncio.run(main())
    assert results == [p["generated_ids"] for p in prompts]
    wait_for_generation_threads()


def test_refusals_raise_the_classes_infer_raises(client, llm, cls_model):
    # Raised by the iteration that reaches them.
    stream = client.generate("no-such-llm", PROMPT)
    with pytest.raises(cloister.NotFound) as caught:
        next(stream)
    assert "\n" not in str(caught.value)
    assert next(stream, None) is None  # the stream has ended
    with pytest.raises(cloister.NotFound):
        client.generate_text("no-such-llm", PROMPT)
    # An ONNX model is not a generative one (and an LLM not an ONNX one: test_api).
    with pytest.raises(cloister.FailedPrecondition, match="is not a generative model"):
        list(client.generate(cls_model, PROMPT))
    # Requests the enclave refuses: a prompt longer than the model's context (512 tokens), a
    # token id outside its vocabulary, more tokens than the context has room for.
    with pytest.raises(cloister.InvalidArgument, match="the model's context holds 512"):
        list(client.generate(llm, prompt_ids=[65] * 600))
    with pytest.raises(cloister.InvalidArgument, match="not below the vocabulary size"):
        list(client.generate(llm, prompt_ids=[5000]))
    with pytest.raises(cloister.InvalidArgument, match="runs past the model's context"):
        client.generate_text(llm, PROMPT, max_tokens=2000)
    # The deadline of the whole stream.
    with pytest.raises(cloister.DeadlineExceeded):
        list(client.generate(llm, PROMPT, max_tokens=400, ignore_eos=True, timeout=0.001))


def test_a_closed_client_refuses_at_once(appliance, key, llm):
    with cloister.connect(appliance.address, policy=appliance.policy, tenant="demo",
                          token=appliance.token, key=key) as other:
        pass
    for call in (other.generate, other.agenerate, other.generate_text):
        with pytest.raises(cloister.FailedPrecondition, match="the client is closed"):
            call(llm, PROMPT)


@pytest.mark.parametrize("arguments, message", [
    (dict(), r"needs a prompt: prompt= \(text\), messages= \(a chat\) or prompt_ids="),
    (dict(prompt="a", messages=[{"role": "user", "content": "b"}]),
     "exactly one of prompt=, messages= and prompt_ids=, not prompt and messages"),
    (dict(prompt="a", prompt_ids=[1]), "not prompt and prompt_ids"),
    (dict(prompt=b"bytes"), "prompt must be a string"),
    (dict(messages="hello"), "messages must be a list of"),
    (dict(messages=[]), "empty list"),
    (dict(messages=[{"role": "user"}]), "message 1 has no content"),
    (dict(messages=[{"content": "x"}]), "message 1 has no role"),
    (dict(messages=[{"role": "user", "content": "x", "name": "n"}]), "unknown key 'name'"),
    (dict(prompt_ids=[]), "prompt_ids is empty"),
    (dict(prompt_ids=[1, -2]), "item 1 is -2"),
    (dict(prompt_ids=[1.5]), "item 0 is 1.5"),
    (dict(prompt_ids="1,2"), "not a string"),
    (dict(prompt="a", max_tokens=0), "max_tokens must be a whole number of tokens from 1"),
    (dict(prompt="a", temperature=2.5), r"temperature must be a number in \[0, 2\], not 2.5"),
    (dict(prompt="a", temperature=float("nan")), "temperature must be a number"),
    (dict(prompt="a", top_p=0), r"top_p must be a number in \(0, 1\]"),
    (dict(prompt="a", top_k=-1), "top_k must be a whole number from 0"),
    (dict(prompt="a", seed=-1), "seed must be a whole number from 0"),
    (dict(prompt="a", seed=2**64), "seed must be a whole number from 0"),
    (dict(prompt="a", stop=[""]), "stop strings must be non-empty"),
    (dict(prompt="a", stop=5), "stop must be a string or a list of strings"),
    (dict(prompt="a", top_logprobs=2), "top_logprobs=2 needs logprobs=True"),
    (dict(prompt="a", logprobs=True, top_logprobs=21), "top_logprobs must be a whole number"),
    (dict(prompt="a", logprobs="yes"), "logprobs must be True or False"),
    (dict(prompt="a", timeout=0), "timeout must be a number of seconds above 0"),
    (dict(prompt="a", min_p=1.5), r"min_p must be a number in \[0, 1\]"),
    (dict(prompt="a", repetition_penalty=0), "repetition_penalty must be a number above 0"),
    (dict(prompt="a", presence_penalty=3), r"presence_penalty must be a number in \[-2, 2\]"),
    (dict(prompt="a", frequency_penalty="x"), "frequency_penalty must be a number"),
    (dict(prompt="a", pad_to=-1), "pad_to must be a whole number of bytes"),
    (dict(prompt="a", tokens_per_chunk=5000), "tokens_per_chunk must be a whole number"),
    (dict(prompt="a", interval_ms=5), "interval_ms must be 0 .no cadence. or a whole number"),
])
def test_bad_arguments_raise_invalid_argument_at_once(client, arguments, message):
    wait_for_generation_threads()
    for call in (client.generate, client.agenerate, client.generate_text):
        with pytest.raises(cloister.InvalidArgument, match=message) as caught:
            call(LLM, **arguments)
        assert isinstance(caught.value, ValueError)
        assert "\n" not in str(caught.value)
    assert not generation_threads()


class FlippingProxy:
    """A TCP proxy in front of cloisterd, like a host that tampers with what it relays: once
    armed, it flips one bit in the last byte of the next HTTP/2 DATA frame cloisterd sends, which
    is the end of a sealed chunk's ciphertext (SealedChunk ends with it; a frame may hold
    several chunks)."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.armed = threading.Event()
        self.flipped = 0
        self.sockets: list = []
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        for s in [self.listener, *self.sockets]:
            try:
                s.close()
            except OSError:
                pass

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self.listener.accept()
                upstream = socket.create_connection(self.target)
            except OSError:
                return
            self.sockets += [downstream, upstream]
            threading.Thread(target=self._pipe, args=(downstream, upstream), daemon=True).start()
            threading.Thread(target=self._frames, args=(upstream, downstream),
                             daemon=True).start()

    @staticmethod
    def _read(source: socket.socket, size: int) -> bytes:
        data = b""
        while len(data) < size:
            part = source.recv(size - len(data))
            if not part:
                raise OSError("closed")
            data += part
        return data

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _frames(self, source: socket.socket, sink: socket.socket) -> None:
        """Server to client: frame by frame (9-byte header: length, type, flags, stream)."""
        try:
            while True:
                header = self._read(source, 9)
                length = int.from_bytes(header[:3], "big")
                payload = bytearray(self._read(source, length))
                padded = bool(header[4] & 0x8) and length > 0  # PADDED: a length byte first
                data_end = length - (payload[0] if padded else 0)
                data_size = data_end - (1 if padded else 0)
                if header[3] == 0 and data_size > 64 and self.armed.is_set():  # DATA
                    self.armed.clear()
                    payload[data_end - 1] ^= 0x01
                    self.flipped += 1
                sink.sendall(header + payload)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def test_a_tampered_stream_is_refused(appliance, key, llm):
    proxy = FlippingProxy(appliance.address)
    try:
        with cloister.connect(proxy.address, policy=appliance.policy, tenant="demo",
                              token=appliance.token, key=key) as through_proxy:
            assert through_proxy.generate_text(llm, PROMPT, temperature=0, max_tokens=4).ids
            proxy.armed.set()
            with pytest.raises(cloister.DataLoss, match=r"chunk \d+ does not open") as caught:
                for _ in through_proxy.generate(llm, PROMPT, temperature=0, max_tokens=16):
                    pass
            assert proxy.flipped == 1
            assert "\n" not in str(caught.value)
            # The session goes on: the next stream is whole.
            assert len(through_proxy.generate_text(llm, PROMPT, temperature=0,
                                                   max_tokens=4).ids) == 4
    finally:
        proxy.close()

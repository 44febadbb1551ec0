"""The Cloister client: connect (attest and open a session), then upload models, infer and
generate text."""

from __future__ import annotations

import concurrent.futures
import os
import threading
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

from . import _native
from ._convert import to_wire
from ._generate import AsyncGenerateStream, GenerateStream, Messages, make_args
from .errors import InvalidArgument
from .types import GenerateResult, ModelInfo, Verdict

__all__ = [
    "Client",
    "connect",
    "attest",
    "verify",
    "generate_key",
    "DEFAULT_SERVER",
]

DEFAULT_SERVER = "127.0.0.1:7700"

PathLike = Union[str, "os.PathLike[str]"]
ProgressCallback = Callable[[int, int], None]


def _env(name: str) -> Optional[str]:
    value = os.environ.get(name)
    return value if value else None


def _path(value: Optional[PathLike]) -> str:
    return os.fspath(value) if value is not None else ""


def _resolve_token(token: Optional[str], client_certificate: bool = False) -> str:
    """The API token: given, else $CLOISTER_TOKEN, else the file named by $CLOISTER_TOKEN_FILE.

    With a client certificate and none of these, no token ("": the certificate alone speaks for
    a tenant bound to mtls_identities)."""
    if token is not None:
        return token
    if _env("CLOISTER_TOKEN"):
        return os.environ["CLOISTER_TOKEN"].strip()
    token_file = _env("CLOISTER_TOKEN_FILE")
    if token_file:
        try:
            with open(token_file, encoding="utf-8") as f:
                return f.read().strip()
        except OSError as e:
            raise InvalidArgument(f"cannot read token file {token_file}: {e.strerror}") from None
    if client_certificate:
        return ""
    raise InvalidArgument("no API token given (token=, CLOISTER_TOKEN or CLOISTER_TOKEN_FILE)")


def _connection(server, policy, tenant, token, tls, fresh, timeout) -> "_native.Connection":
    """The connection settings, each from its argument or else the CLI's environment variable."""
    connection = _native.Connection()
    connection.server = server or _env("CLOISTER_SERVER") or DEFAULT_SERVER
    connection.policy = _path(policy) or _env("CLOISTER_POLICY") or ""
    connection.tenant = tenant or _env("CLOISTER_TENANT") or ""
    if not connection.tenant:
        raise InvalidArgument("no tenant id given (tenant= or CLOISTER_TENANT)")
    ca, client_cert, client_key, server_name = tls
    connection.token = _resolve_token(
        token, bool(_path(client_cert) or _env("CLOISTER_CLIENT_CERT")))
    connection.tls_ca = _path(ca) or _env("CLOISTER_CA") or ""
    connection.tls_client_cert = _path(client_cert) or _env("CLOISTER_CLIENT_CERT") or ""
    connection.tls_client_key = _path(client_key) or _env("CLOISTER_CLIENT_KEY") or ""
    connection.tls_server_name = server_name or ""
    connection.fresh = bool(fresh)
    connection.timeout = timeout
    return connection


def _spread(spread) -> bool:
    """spread=, else $CLOISTER_SPREAD (1, true, 0 or false) as the CLI reads it."""
    if spread is not None:
        return bool(spread)
    value = _env("CLOISTER_SPREAD")
    if value in (None, "", "0", "false"):
        return False
    if value in ("1", "true"):
        return True
    raise InvalidArgument(f"CLOISTER_SPREAD must be 1, true, 0 or false, not {value!r}")


class Client:
    """An attested, end-to-end encrypted session with the enclave behind a ``cloisterd``.

    Make one with :func:`connect`. Every call is encrypted to the enclave that passed
    attestation; the host only relays ciphertext. A client is thread-safe: several threads
    may call :meth:`infer` at once (the GIL is released while a call waits), and
    :meth:`infer_async` runs calls on the client's own thread pool; :meth:`generate` (and
    :meth:`agenerate`, :meth:`chat`, :meth:`generate_text`) streams text from an LLM, each
    stream on a thread of its own. Sessions that expire are
    replaced (after attesting again) transparently. Use it as a context manager, or call
    :meth:`close` when done.
    """

    def __init__(self, native: "_native.NativeClient", async_workers: int) -> None:
        self._native = native
        self._async_workers = async_workers
        self._executor: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._executor_lock = threading.Lock()

    # ---- Attestation ----

    @property
    def verdict(self) -> Verdict:
        """The verdict of the latest attestation (the one that admitted the current session)."""
        return Verdict._from_native(self._native.verdict())

    @property
    def claims(self) -> Dict[str, str]:
        """Facts from the attested evidence, e.g. ``claims["cvm.measurement"]``."""
        return self.verdict.claims

    @property
    def evidence(self) -> bytes:
        """The serialized evidence bundle that the latest attestation verified. Keep it for
        audits, or check it again offline with :func:`cloister.verify`."""
        return self._native.evidence()

    @property
    def tenant(self) -> str:
        return self._native.tenant_id()

    @property
    def public_key(self) -> str:
        """The identity key's public key (hex): the owner of the models you upload."""
        return self._native.public_key()

    @property
    def session_id(self) -> str:
        """The current session's id (hex)."""
        return self._native.session_id().hex()

    # ---- Models ----

    def upload_model(
        self,
        model: Union[PathLike, bytes, bytearray, memoryview],
        name: str,
        progress: Optional[ProgressCallback] = None,
    ) -> ModelInfo:
        """Encrypts a model (an ONNX file path, its bytes, or a Hugging Face checkpoint
        folder) with a fresh key and uploads it under ``name``. A folder (config.json,
        tokenizer.json, model.safetensors or its shards, ...) is packed into one deterministic
        archive first, whose SHA-256 is the returned ``digest``; its other files are left out
        and links in it are refused. A name that is taken raises
        :class:`cloister.AlreadyExists`: delete the old model first to replace it.

        Args:
            model: the path of the model file or checkpoint folder, or the model itself as
                bytes.
            name: the name to run it under with :meth:`infer`.
            progress: called as ``progress(sent_bytes, total_bytes)`` after each piece of
                ciphertext is sent. If it raises, it is not called again and its exception is
                raised when the upload returns.

        Returns:
            The enclave's description of the loaded model (inputs, outputs, size).
        """
        if isinstance(model, (bytes, bytearray, memoryview)):
            return ModelInfo._from_native(self._native.upload_model_bytes(model, name, progress))
        return ModelInfo._from_native(self._native.upload_model(os.fspath(model), name, progress))

    def models(self) -> List[ModelInfo]:
        """The models your identity key owns."""
        return [ModelInfo._from_native(m) for m in self._native.list_models()]

    def delete_model(self, name: str) -> None:
        """Deletes one of your models from the enclave and its ciphertext from the host.
        Raises :class:`cloister.NotFound` when there is no such model."""
        self._native.delete_model(name)

    # ---- Inference ----

    def infer(
        self,
        model: str,
        inputs: Mapping[str, "np.typing.ArrayLike"],
        outputs: Optional[Sequence[str]] = None,
        timeout: Optional[float] = None,
    ) -> Dict[str, np.ndarray]:
        """Runs ``model`` on ``inputs`` inside the enclave.

        Args:
            model: the name the model was uploaded under.
            inputs: input name -> numpy array (any array-like is converted with
                ``numpy.asarray``). Use the model's datatypes: a model that takes float32
                needs float32 arrays (``x.astype(np.float32)``).
            outputs: the output names wanted; ``None`` for all of them.
            timeout: seconds for this call (default: the client's timeout).

        Returns:
            Output name -> numpy array, in the model's output order.

        Raises:
            InvalidArgument: wrong input names, datatypes or shapes.
            NotFound: no model of that name for your key.
            ResourceExhausted: over the tenant's limits; back off and retry.
            DeadlineExceeded: it did not finish within ``timeout``.
        """
        if not isinstance(inputs, Mapping):
            raise InvalidArgument("inputs must be a mapping of input name to array")
        if isinstance(outputs, str):
            raise InvalidArgument("outputs must be a list of names, not one string")
        wire = [to_wire(name, value) for name, value in inputs.items()]
        wanted = [] if outputs is None else list(outputs)
        results = self._native.infer(model, wire, wanted, timeout)
        return {name: array for name, array in results}

    def infer_async(
        self,
        model: str,
        inputs: Mapping[str, "np.typing.ArrayLike"],
        outputs: Optional[Sequence[str]] = None,
        timeout: Optional[float] = None,
    ) -> "concurrent.futures.Future[Dict[str, np.ndarray]]":
        """Like :meth:`infer`, but returns at once with a ``concurrent.futures.Future``.

        Up to ``async_workers`` (see :func:`connect`) calls run at the same time; the rest
        wait in order. The inputs are converted before this returns, so the caller may reuse
        its arrays. With asyncio: ``await asyncio.wrap_future(client.infer_async(...))``.
        """
        if not isinstance(inputs, Mapping):
            raise InvalidArgument("inputs must be a mapping of input name to array")
        if isinstance(outputs, str):
            raise InvalidArgument("outputs must be a list of names, not one string")
        wire = [to_wire(name, np.array(value, copy=True)) for name, value in inputs.items()]
        wanted = [] if outputs is None else list(outputs)

        def run() -> Dict[str, np.ndarray]:
            return {name: array for name, array in self._native.infer(model, wire, wanted, timeout)}

        return self._pool().submit(run)

    # ---- Generation ----

    def generate(
        self,
        model: str,
        prompt: Optional[str] = None,
        *,
        messages: Optional[Messages] = None,
        prompt_ids: Optional[Sequence[int]] = None,
        max_tokens: Optional[int] = None,
        temperature: Optional[float] = None,
        top_p: Optional[float] = None,
        top_k: int = 0,
        seed: Optional[int] = None,
        stop: Union[str, Sequence[str], None] = None,
        logprobs: bool = False,
        top_logprobs: int = 0,
        ignore_eos: bool = False,
        min_p: float = 0.0,
        repetition_penalty: Optional[float] = None,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        pad_to: int = 0,
        tokens_per_chunk: int = 0,
        interval_ms: int = 0,
        timeout: Optional[float] = None,
    ) -> GenerateStream:
        """Generates text with the LLM ``model`` (a checkpoint folder you uploaded) and returns
        its chunks as they arrive: ``for chunk in client.generate(...): print(chunk.text)``.

        Give exactly one prompt: ``prompt`` (text, tokenized with the model's special tokens),
        ``messages`` (a chat, rendered by the model's chat template with the generation
        prompt added) or ``prompt_ids`` (token ids, used as given).

        Args:
            model: the name the model was uploaded under.
            prompt: the prompt text.
            messages: ``[{"role": "user", "content": "..."}, ...]``.
            prompt_ids: the prompt's token ids.
            max_tokens: the most tokens to generate (None: up to the model's context).
            temperature: in [0, 2] (None: 1); 0 is greedy, the same tokens every time.
            top_p: nucleus sampling, in (0, 1] (None: 1, off).
            top_k: sample among the k most likely tokens (0: off).
            seed: the sampler's seed, for a repeatable sampled answer (None: the enclave picks
                one). A seeded generation that fails before its first chunk is retried.
            stop: a string or strings that end the generation; not included in the text.
            logprobs: give each token's log-probability (``chunk.logprobs``).
            top_logprobs: also give the 0..20 most likely alternatives of each token
                (``chunk.top_logprobs``); needs ``logprobs=True``.
            ignore_eos: go on past the end-of-sequence token (until max_tokens).
            min_p: drop tokens less likely than min_p times the most likely one, in [0, 1]
                (0: off).
            repetition_penalty: above 0 (None: 1, off); above 1 makes tokens already in the
                prompt or the answer less likely.
            presence_penalty, frequency_penalty: in [-2, 2], OpenAI's: subtracted from a
                token's logit once if it appeared, and per time it appeared.
            pad_to: pad each sealed chunk to a multiple of this many bytes (0: 256, the
                default; 1: none), so its size does not tell the text's length.
            tokens_per_chunk: send tokens this many at a time (0 or 1: each as it comes).
            interval_ms: a fixed cadence, 10 to 10000 ms (0: off): one chunk per interval with
                the tokens that came since the last, so chunk times do not tell token times.
            timeout: seconds for the whole stream (default: the client's timeout).

        Returns:
            A :class:`GenerateStream` of :class:`GenerateChunk`; the generation starts when
            the first chunk is asked for. Once it has ended, ``stream.result`` is the whole
            :class:`GenerateResult`. :meth:`GenerateStream.close` stops the deliveries, but
            the generation runs on to its end in the enclave (docs/PYTHON.md, "Generation").

        Raises:
            InvalidArgument: at once, for arguments that are missing or out of range (none or
                several prompts, a bad sampling value).
            FailedPrecondition: at once, for a closed client.
            While iterating, the stream's failure, as :meth:`infer` raises them:
            NotFound (no such model for your key), FailedPrecondition (not an LLM),
            InvalidArgument (the enclave refused the request), ResourceExhausted,
            DeadlineExceeded, DataLoss (a chunk failed the client's checks: dropped,
            reordered, replayed, tampered with, or a stream cut short).
        """
        args = make_args(prompt, messages, prompt_ids, max_tokens, temperature, top_p, top_k,
                         seed, stop, logprobs, top_logprobs, ignore_eos, min_p=min_p,
                         repetition_penalty=repetition_penalty,
                         presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                         pad_to=pad_to, tokens_per_chunk=tokens_per_chunk,
                         interval_ms=interval_ms)
        return GenerateStream(self._native.generate(model, args, timeout))

    def agenerate(
        self,
        model: str,
        prompt: Optional[str] = None,
        *,
        messages: Optional[Messages] = None,
        prompt_ids: Optional[Sequence[int]] = None,
        max_tokens: Optional[int] = None,
        temperature: Optional[float] = None,
        top_p: Optional[float] = None,
        top_k: int = 0,
        seed: Optional[int] = None,
        stop: Union[str, Sequence[str], None] = None,
        logprobs: bool = False,
        top_logprobs: int = 0,
        ignore_eos: bool = False,
        min_p: float = 0.0,
        repetition_penalty: Optional[float] = None,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        pad_to: int = 0,
        tokens_per_chunk: int = 0,
        interval_ms: int = 0,
        timeout: Optional[float] = None,
    ) -> AsyncGenerateStream:
        """:meth:`generate` for asyncio: ``async for chunk in client.agenerate(...)``. The
        arguments and errors are those of :meth:`generate`; the chunks come into the running
        event loop without blocking it."""
        args = make_args(prompt, messages, prompt_ids, max_tokens, temperature, top_p, top_k,
                         seed, stop, logprobs, top_logprobs, ignore_eos, min_p=min_p,
                         repetition_penalty=repetition_penalty,
                         presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                         pad_to=pad_to, tokens_per_chunk=tokens_per_chunk,
                         interval_ms=interval_ms)
        return AsyncGenerateStream(self._native.generate(model, args, timeout))

    def generate_text(
        self,
        model: str,
        prompt: Optional[str] = None,
        *,
        messages: Optional[Messages] = None,
        prompt_ids: Optional[Sequence[int]] = None,
        max_tokens: Optional[int] = None,
        temperature: Optional[float] = None,
        top_p: Optional[float] = None,
        top_k: int = 0,
        seed: Optional[int] = None,
        stop: Union[str, Sequence[str], None] = None,
        logprobs: bool = False,
        top_logprobs: int = 0,
        ignore_eos: bool = False,
        min_p: float = 0.0,
        repetition_penalty: Optional[float] = None,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        pad_to: int = 0,
        tokens_per_chunk: int = 0,
        interval_ms: int = 0,
        timeout: Optional[float] = None,
    ) -> GenerateResult:
        """:meth:`generate` without streaming: waits (GIL released) for the whole generation
        and returns it, ``result.text`` and ``result.ids`` with its usage and receipt. The
        arguments and errors are those of :meth:`generate`, all raised here. (Log-probabilities
        come only with the chunks of :meth:`generate`.)"""
        args = make_args(prompt, messages, prompt_ids, max_tokens, temperature, top_p, top_k,
                         seed, stop, logprobs, top_logprobs, ignore_eos, min_p=min_p,
                         repetition_penalty=repetition_penalty,
                         presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                         pad_to=pad_to, tokens_per_chunk=tokens_per_chunk,
                         interval_ms=interval_ms)
        return GenerateResult._from_native(self._native.generate(model, args, timeout).run(None))

    def chat(self, model: str, messages: Messages, **options: Any) -> GenerateStream:
        """``generate(model, messages=messages, **options)``: streams the model's answer to a
        chat, ``[{"role": "system", "content": ...}, {"role": "user", "content": ...}]``."""
        return self.generate(model, messages=messages, **options)

    # ---- Lifetime ----

    def close(self) -> None:
        """Waits for calls started with infer_async, then drops the session. Streams still
        open keep it until they end."""
        with self._executor_lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)
        self._native.close()

    @property
    def closed(self) -> bool:
        return self._native.closed

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        if self.closed:
            return "<cloister.Client closed>"
        return f"<cloister.Client tenant={self.tenant!r} session={self.session_id}>"

    def _pool(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._executor_lock:
            if self._executor is None:
                if self._native.closed:
                    self._native.session_id()  # raises FailedPrecondition: closed
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=self._async_workers, thread_name_prefix="cloister-infer"
                )
            return self._executor


def connect(
    server: Optional[str] = None,
    policy: Optional[PathLike] = None,
    tenant: Optional[str] = None,
    token: Optional[str] = None,
    key: Optional[PathLike] = None,
    *,
    ca: Optional[PathLike] = None,
    client_cert: Optional[PathLike] = None,
    client_key: Optional[PathLike] = None,
    tls_server_name: Optional[str] = None,
    fresh: bool = False,
    timeout: Optional[float] = None,
    async_workers: int = 8,
    spread: Optional[bool] = None,
) -> Client:
    """Attests the enclave behind ``server`` and opens an encrypted session to it.

    Each setting falls back to the environment variable the ``cloister`` CLI reads.

    Args:
        server: ``HOST:PORT`` of cloisterd ($CLOISTER_SERVER, default ``127.0.0.1:7700``);
            several comma-separated (``"a:7700,b:7700"``): the session opens on the first that
            attests and moves to the next when that node goes down. Models are per node, so
            upload a model to every node listed.
        spread: with several servers, start from the one this identity key picks (a hash
            of its public key) instead of the first, so that one list spreads tenants over
            the nodes ($CLOISTER_SPREAD=1).
        policy: path of your attestation policy (YAML) ($CLOISTER_POLICY).
        tenant: your tenant id ($CLOISTER_TENANT).
        token: your API token, the string itself ($CLOISTER_TOKEN, or the file named by
            $CLOISTER_TOKEN_FILE).
        key: path of your identity key, made by :func:`generate_key` ($CLOISTER_KEY).
        ca: PEM CA bundle that cloisterd's TLS certificate must chain to ($CLOISTER_CA);
            without it the connection is plaintext (the session is end-to-end encrypted
            either way, but the API token is not).
        client_cert, client_key: your PEM certificate chain and key for mutual TLS
            ($CLOISTER_CLIENT_CERT, $CLOISTER_CLIENT_KEY).
        tls_server_name: the name cloisterd's certificate carries, when it is not the host
            in ``server``.
        fresh: attest with hardware evidence collected over this client's nonce (slower)
            instead of the enclave's cached evidence countersigned over it.
        timeout: seconds for each call (default 60).
        async_workers: how many :meth:`Client.infer_async` calls run at once.

    Raises:
        AttestationError: the evidence fails the policy; ``error.failed_checks`` lists why.
        Unavailable: cloisterd cannot be reached.
        Unauthenticated: unknown tenant or wrong token.
        InvalidArgument, NotFound, FailedPrecondition: a missing or bad policy or key.
    """
    if async_workers < 1:
        raise InvalidArgument(f"async_workers must be at least 1, not {async_workers}")
    connection = _connection(server, policy, tenant, token,
                             (ca, client_cert, client_key, tls_server_name), fresh, timeout)
    connection.spread = _spread(spread)
    key_path = _path(key) or _env("CLOISTER_KEY") or ""
    return Client(_native.NativeClient.connect(connection, key_path), async_workers)


def attest(
    server: Optional[str] = None,
    policy: Optional[PathLike] = None,
    tenant: Optional[str] = None,
    token: Optional[str] = None,
    *,
    ca: Optional[PathLike] = None,
    client_cert: Optional[PathLike] = None,
    client_key: Optional[PathLike] = None,
    tls_server_name: Optional[str] = None,
    fresh: bool = False,
    timeout: Optional[float] = None,
) -> Verdict:
    """Only checks the server's attestation evidence against ``policy`` (no key needed), as
    ``cloister attest`` does; the settings are those of :func:`connect`. Returns the verdict,
    passing or not; raises only when no verdict could be reached (unreachable server, bad
    policy, unparseable evidence)."""
    connection = _connection(server, policy, tenant, token,
                             (ca, client_cert, client_key, tls_server_name), fresh, timeout)
    return Verdict._from_native(_native.attest(connection))


def verify(
    evidence: bytes,
    policy: PathLike,
    *,
    nonce: Optional[bytes] = None,
    at: Optional[float] = None,
) -> Verdict:
    """Checks attestation evidence offline against a policy, as ``cloister-verify bundle`` does.

    Args:
        evidence: a serialized evidence bundle (such as :attr:`Client.evidence`) or challenge
            response.
        policy: path of the policy (YAML).
        nonce: the nonce the evidence must be bound to; a bundle without one is checked
            against its own nonce (which shows integrity, not freshness).
        at: the time to check at, in seconds since the epoch (default: now).

    Returns:
        The verdict; ``verdict.passed`` says whether it satisfies the policy.
    """
    if not isinstance(evidence, (bytes, bytearray, memoryview)):
        raise InvalidArgument("evidence must be bytes")
    nonce_bytes = None if nonce is None else bytes(nonce)
    return Verdict._from_native(_native.verify(bytes(evidence), os.fspath(policy), nonce_bytes, at))


def generate_key(path: PathLike) -> str:
    """Creates a new tenant identity key at ``path`` (mode 0600), as ``cloister keygen`` does,
    and returns its public key (hex). The key owns every model you upload with it: keep it
    safe. Raises :class:`cloister.AlreadyExists` rather than overwrite a file."""
    return _native.generate_key(os.fspath(path))

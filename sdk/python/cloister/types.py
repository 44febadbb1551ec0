"""Plain value types of the Cloister client: attestation verdicts, model descriptions and the
pieces of a text generation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

__all__ = [
    "Check",
    "Verdict",
    "TensorInfo",
    "ModelInfo",
    "Usage",
    "TokenLogprob",
    "GenerateChunk",
    "GenerateResult",
]


@dataclass(frozen=True)
class Check:
    """One attestation check.

    Attributes:
        name: a stable name such as ``"cvm.measurement"`` or ``"gpu0.nonce"``.
        result: ``"pass"``, ``"fail"`` or ``"skipped"``.
        detail: why, in one line.
    """

    name: str
    result: str
    detail: str

    @property
    def passed(self) -> bool:
        return self.result == "pass"


@dataclass(frozen=True)
class Verdict:
    """The outcome of checking attestation evidence against a policy.

    Attributes:
        passed: True only when every required check passed and none failed.
        checks: every check in the order it ran.
        claims: facts read from the authenticated evidence, e.g. ``"cvm.measurement"``.
    """

    passed: bool
    checks: List[Check] = field(default_factory=list)
    claims: Dict[str, str] = field(default_factory=dict)

    @property
    def failed_checks(self) -> List[Check]:
        return [check for check in self.checks if check.result == "fail"]

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        lines = ["attestation: " + ("PASS" if self.passed else "FAIL")]
        for check in self.checks:
            mark = {"pass": "pass", "fail": "FAIL"}.get(check.result, "skip")
            lines.append(f"  [{mark}] {check.name}" + (f": {check.detail}" if check.detail else ""))
        return "\n".join(lines)

    @classmethod
    def _from_native(cls, native: Tuple[bool, list, dict]) -> "Verdict":
        passed, checks, claims = native
        return cls(bool(passed), [Check(*c) for c in checks], dict(claims))


@dataclass(frozen=True)
class TensorInfo:
    """An input or output of a model: name, KServe datatype (``"FP32"``...) and shape
    (``-1`` for a dynamic dimension)."""

    name: str
    datatype: str
    shape: Tuple[int, ...]


@dataclass(frozen=True)
class ModelInfo:
    """A model stored in the enclave for your identity key, or published by the operator.

    Attributes:
        name: the name you uploaded it under.
        handle: the opaque handle the host knows it by (derived from your key and the name).
        size: the model file's size in bytes (for an LLM, its package's).
        inputs, outputs: its tensors (none for an LLM).
        rows_coalesce: True when the enclave proved at load that each output row depends on its
            own input row only, so several of your requests may share one model run.
        rows_shared_reason: otherwise, which node mixes rows (or has no rule for them); your
            requests then run one by one, with the same results.
        kind: "onnx" or "llm" (a checkpoint folder, run with Generate, not infer).
        digest: hex SHA-256 of what was uploaded: the ONNX file, or the folder's package.
        published: True for a model the operator publishes to every tenant (its digest is also
            in the attested claims); you use it by name and cannot delete it.
    """

    name: str
    handle: str
    size: int
    inputs: List[TensorInfo]
    outputs: List[TensorInfo]
    rows_coalesce: bool = False
    rows_shared_reason: str = ""
    kind: str = ""
    digest: str = ""
    published: bool = False

    @classmethod
    def _from_native(cls, native: tuple) -> "ModelInfo":
        (name, handle, size, inputs, outputs, rows_coalesce, rows_shared_reason, kind, digest,
         published) = native
        return cls(
            name,
            handle,
            int(size),
            [TensorInfo(n, d, tuple(s)) for n, d, s in inputs],
            [TensorInfo(n, d, tuple(s)) for n, d, s in outputs],
            bool(rows_coalesce),
            rows_shared_reason,
            kind,
            digest,
            bool(published),
        )


@dataclass(frozen=True)
class Usage:
    """The tokens a generation used, as the enclave counted them.

    Attributes:
        prompt_tokens: the prompt's tokens (a chat as the model's template rendered it).
        cached_tokens: prompt tokens whose keys and values came from the enclave's prefix cache.
        completion_tokens: the tokens generated.
    """

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int

    @classmethod
    def _from_native(cls, native: Tuple[int, int, int]) -> "Usage":
        return cls(*(int(n) for n in native))


@dataclass(frozen=True)
class TokenLogprob:
    """A token id and its log-probability."""

    id: int
    logprob: float


@dataclass(frozen=True)
class GenerateChunk:
    """One piece of a generation as it arrives: the tokens sampled since the previous chunk and
    the text that became final with them (whole characters; a stop string is left out, so a
    chunk may carry tokens and no text). The last chunk of a stream also says why it ended.

    Attributes:
        text: the new text.
        token_ids: the new tokens' ids.
        logprobs: each new token's log-probability, with ``logprobs=True``; else ``None``.
        top_logprobs: for each new token, the ``top_logprobs`` most likely alternatives (most
            likely first), when asked for; else ``None``.
        finish_reason: on the last chunk, ``"stop"`` (end of sequence or a stop string),
            ``"length"`` (max_tokens or the model's context) or ``"cancelled"`` (the call was
            cancelled in the enclave, e.g. its deadline passed); else ``None``.
        usage: on the last chunk, the request's :class:`Usage`; else ``None``.
        receipt, receipt_signature: on the last chunk, the enclave's signed account of the
            request (a serialized ``cloister.boundary.v1.UsageReceipt`` and its Ed25519
            signature, docs/PROTOCOL.md section 7); else ``None``.
    """

    text: str
    token_ids: List[int]
    logprobs: Optional[List[float]] = None
    top_logprobs: Optional[List[List[TokenLogprob]]] = None
    finish_reason: Optional[str] = None
    usage: Optional[Usage] = None
    receipt: Optional[bytes] = None
    receipt_signature: Optional[bytes] = None

    @property
    def final(self) -> bool:
        """Whether this is the stream's last chunk."""
        return self.finish_reason is not None

    @classmethod
    def _from_native(cls, native: tuple) -> "GenerateChunk":
        text, ids, logprobs, top, finish_reason, usage, receipt, signature = native
        alternatives = None if top is None else [[TokenLogprob(*t) for t in each] for each in top]
        if not finish_reason:
            return cls(text, list(ids), logprobs, alternatives)
        return cls(text, list(ids), logprobs, alternatives, finish_reason,
                   Usage._from_native(usage), bytes(receipt), bytes(signature))


@dataclass(frozen=True)
class GenerateResult:
    """A whole generation, put together from its chunks after every chunk passed the client's
    checks.

    Attributes:
        ids: the generated token ids, in order.
        text: the generated text (a stop string is left out).
        finish_reason: ``"stop"``, ``"length"`` or ``"cancelled"`` (see :class:`GenerateChunk`).
        usage: the tokens it used.
        receipt, receipt_signature: the enclave's signed account of the request.
        chunk_count: how many chunks the stream had, the last one included.
    """

    ids: List[int]
    text: str
    finish_reason: str
    usage: Usage
    receipt: bytes
    receipt_signature: bytes
    chunk_count: int

    @classmethod
    def _from_native(cls, native: tuple) -> "GenerateResult":
        ids, text, finish_reason, usage, receipt, signature, chunk_count = native
        return cls(list(ids), text, finish_reason, Usage._from_native(usage), bytes(receipt),
                   bytes(signature), int(chunk_count))

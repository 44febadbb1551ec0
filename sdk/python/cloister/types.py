"""Plain value types of the Cloister client: attestation verdicts and model descriptions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Tuple

__all__ = ["Check", "Verdict", "TensorInfo", "ModelInfo"]


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
    """A model stored in the enclave for your identity key.

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

    @classmethod
    def _from_native(cls, native: tuple) -> "ModelInfo":
        name, handle, size, inputs, outputs, rows_coalesce, rows_shared_reason, kind, digest = (
            native
        )
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
        )

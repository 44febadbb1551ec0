"""Cloister: confidential inference from Python.

Attest the enclave behind a ``cloisterd``, then upload models and run inference end to end
encrypted, with numpy arrays in and out, or generate text with an LLM::

    import numpy as np
    import cloister

    client = cloister.connect("127.0.0.1:7700", policy="dev-policy.yaml", tenant="demo",
                              token=open("demo.token").read().strip(), key="tenant.key")
    client.upload_model("model.onnx", "cls")
    outputs = client.infer("cls", {"x": np.zeros((1, 3, 48, 192), np.float32)})

    client.upload_model("tiny-llama/", "llm")            # a checkpoint folder
    for chunk in client.generate("llm", "The meaning of life", max_tokens=16):
        print(chunk.text, end="", flush=True)

See docs/PYTHON.md for the whole API. Errors are subclasses of :class:`cloister.Error`.
"""

from __future__ import annotations

try:
    from . import _native
except ImportError as e:  # the pure-Python sources without the built module
    raise ImportError(
        "cloister's extension module is missing: install the package with "
        "`pip install ./sdk/python`, or put the build's python/ folder "
        f"on PYTHONPATH ({e})"
    ) from e
from ._client import DEFAULT_SERVER, Client, attest, connect, generate_key, verify
from ._generate import AsyncGenerateStream, GenerateStream
from .errors import (
    Aborted,
    AlreadyExists,
    AttestationError,
    Cancelled,
    DataLoss,
    DeadlineExceeded,
    Error,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    OutOfRange,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    Unimplemented,
    Unknown,
    _make_error,
)
from .types import (
    Check,
    GenerateChunk,
    GenerateResult,
    ModelInfo,
    TensorInfo,
    TokenLogprob,
    Usage,
    Verdict,
)

_native._set_error_factory(_make_error)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_SERVER",
    "Client",
    "connect",
    "attest",
    "verify",
    "generate_key",
    "Check",
    "Verdict",
    "ModelInfo",
    "TensorInfo",
    "GenerateStream",
    "AsyncGenerateStream",
    "GenerateChunk",
    "GenerateResult",
    "TokenLogprob",
    "Usage",
    "Error",
    "Aborted",
    "AlreadyExists",
    "AttestationError",
    "Cancelled",
    "DataLoss",
    "DeadlineExceeded",
    "FailedPrecondition",
    "Internal",
    "InvalidArgument",
    "NotFound",
    "OutOfRange",
    "PermissionDenied",
    "ResourceExhausted",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "Unknown",
]

"""Fixtures for the Python SDK tests: a real appliance (cloisterd spawning the real
cloister-enclave, simulated TEE, CPU executor) on a loopback port with its own data dir, a
tenant key, a connected client, and the shared models with their reference data.

Environment (set by the CMake test registration):
  CLOISTERD_BINARY      the cloisterd executable
  CLOISTER_SHARED_DIR   the shared data folder (models/ with testdata/)
  CLOISTER_EXAMPLES_DIR the examples/ folder of the repository
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import pytest

import cloister

# Payloads above this are refused with RESOURCE_EXHAUSTED by the test appliance (the shared
# models' inputs are all far smaller).
MAX_PAYLOAD_BYTES = 4 << 20

# Model name -> file under models/, as in models/README.md; the name is also the testdata folder.
SHARED_MODELS = {
    "ch_ppocr_mobile_v2.0_cls": "ocr/ch_ppocr_mobile_v2.0_cls_infer.onnx",
    "ch_PP-OCRv4_rec": "ocr/ch_PP-OCRv4_rec_infer.onnx",
    "silero_vad_op18_ifless": "vad/silero_vad_op18_ifless.onnx",
    "bert_mini_l4_h256": "bert_mini/bert_mini_l4_h256.onnx",
}
CLS = "ch_ppocr_mobile_v2.0_cls"
REC = "ch_PP-OCRv4_rec"


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: longer runs, left out of the default test run")


def _required_env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set; run these tests through ctest (label python)")
    return value


def shared_dir() -> Path:
    path = Path(_required_env("CLOISTER_SHARED_DIR"))
    if not (path / "models" / "testdata").is_dir():
        pytest.fail(f"CLOISTER_SHARED_DIR={path} has no models/testdata (set it with "
                    f"cmake -DCLOISTER_SHARED_DIR=...)")
    return path


def models_dir() -> Path:
    return shared_dir() / "models"


def examples_dir() -> Path:
    return Path(_required_env("CLOISTER_EXAMPLES_DIR"))


def model_path(name: str) -> Path:
    return models_dir() / SHARED_MODELS[name]


class Appliance:
    """A cloisterd child process started as a user would start it, with --listen
    127.0.0.1:0 (a free port), its own --data-dir, and a --config with test limits."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.data_dir = work / "data"
        self.config = work / "cloisterd.yaml"
        self.stdout_path = work / "cloisterd.out"
        self.stderr_path = work / "cloisterd.err"
        self.address = ""
        self.process: subprocess.Popen | None = None

    def _write_config(self, operator_section: bool) -> None:
        text = ("# limits for the Python SDK tests\n"
                "tenant_defaults:\n"
                f"  max_payload_bytes: {MAX_PAYLOAD_BYTES}\n")
        if operator_section:
            # The operator API (and /metrics beside it) on a free port too, so that several
            # test appliances can run at once.
            text += "operator:\n  listen: \"127.0.0.1:0\"\n"
        self.config.write_text(text)

    def start(self, timeout: float = 60.0) -> None:
        self._write_config(operator_section=True)
        if self._start(timeout):
            return
        if "operator" in self.logs():
            # A cloisterd without an operator API refuses the section: run it without.
            self._write_config(operator_section=False)
            if self._start(timeout):
                return
        pytest.fail(f"cloisterd did not start:\n{self.logs()}")

    def _start(self, timeout: float) -> bool:
        binary = _required_env("CLOISTERD_BINARY")
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.process = subprocess.Popen(
                [binary, "--listen", "127.0.0.1:0", "--data-dir", str(self.data_dir),
                 "--config", str(self.config)],
                stdout=out, stderr=err, stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.stdout_path.read_text(errors="replace").splitlines():
                if line.startswith("cloisterd listening on "):
                    self.address = line.rsplit(" ", 1)[1]
                    return True
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        return False

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def logs(self) -> str:
        text = ""
        for path in (self.stdout_path, self.stderr_path):
            if path.exists():
                text += path.read_text(errors="replace")
        return text

    @property
    def policy(self) -> Path:
        return self.data_dir / "dev-policy.yaml"

    @property
    def token_file(self) -> Path:
        return self.data_dir / "demo.token"

    @property
    def token(self) -> str:
        return self.token_file.read_text().strip()

    def env(self, key: Path) -> Dict[str, str]:
        """The CLOISTER_* variables the CLI and cloister.connect() read."""
        env = dict(os.environ)
        env.update({
            "CLOISTER_SERVER": self.address,
            "CLOISTER_POLICY": str(self.policy),
            "CLOISTER_TENANT": "demo",
            "CLOISTER_TOKEN_FILE": str(self.token_file),
            "CLOISTER_KEY": str(key),
        })
        return env


@pytest.fixture(scope="session")
def work_dir():
    with tempfile.TemporaryDirectory(prefix="cloister-py-") as path:
        yield Path(path)


@pytest.fixture(scope="session")
def appliance(work_dir):
    appliance = Appliance(work_dir)
    appliance.start()
    yield appliance
    appliance.stop()


@pytest.fixture(scope="session")
def key(work_dir) -> Path:
    path = work_dir / "tenant.key"
    cloister.generate_key(path)
    return path


@pytest.fixture(scope="session")
def client(appliance, key):
    with cloister.connect(appliance.address, policy=appliance.policy, tenant="demo",
                          token=appliance.token, key=key) as client:
        yield client


def _uploaded(client, name: str) -> str:
    if not any(model.name == name for model in client.models()):
        client.upload_model(model_path(name), name)
    return name


@pytest.fixture(scope="session")
def cls_model(client) -> str:
    return _uploaded(client, CLS)


@pytest.fixture(scope="session")
def rec_model(client) -> str:
    return _uploaded(client, REC)


def reference_sets(name: str) -> List[Tuple[Dict[str, np.ndarray], Dict[str, np.ndarray]]]:
    """(inputs, outputs) of each reference set of a shared model: the ONNX TensorProto files
    testdata/<name>/test_data_set_N/{input,output}_K.pb, keyed by the tensor names they hold."""
    import onnx
    from onnx import numpy_helper

    sets = []
    root = models_dir() / "testdata" / name
    for set_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        tensors = {}
        for prefix in ("input", "output"):
            found = {}
            for k in range(64):
                path = set_dir / f"{prefix}_{k}.pb"
                if not path.exists():
                    break
                proto = onnx.load_tensor(str(path))
                found[proto.name] = numpy_helper.to_array(proto)
            tensors[prefix] = found
        assert tensors["input"] and tensors["output"], set_dir
        sets.append((tensors["input"], tensors["output"]))
    assert sets, root
    return sets


def assert_matches_reference(actual: np.ndarray, expected: np.ndarray, what: str) -> None:
    """The shared models' tolerance: |a - b| <= 1e-3 + 1e-3 * |b|, same dtype and shape."""
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    np.testing.assert_allclose(actual, expected, rtol=1e-3, atol=1e-3, err_msg=what)

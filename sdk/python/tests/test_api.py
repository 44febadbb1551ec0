"""The client API around a session: keys, attestation results, offline verification, model
management and settings from the environment."""

from __future__ import annotations

import re
import stat

import numpy as np
import pytest

import cloister
from conftest import CLS, model_path, reference_sets, shared_dir


def test_generate_key_writes_a_private_key_file(work_dir):
    path = work_dir / "fresh.key"
    public_key = cloister.generate_key(path)
    assert re.fullmatch(r"[0-9a-f]{64}", public_key)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert text.startswith("CLOISTER ED25519 PRIVATE KEY\n")
    assert f"public: {public_key}" in text
    assert cloister.generate_key(work_dir / "other.key") != public_key


def test_connect_attests_and_exposes_the_verdict(client, key):
    verdict = client.verdict
    assert verdict.passed and bool(verdict)
    assert verdict.checks and not verdict.failed_checks
    assert re.fullmatch(r"[0-9a-f]{96}", client.claims["cvm.measurement"])
    assert client.claims == verdict.claims
    assert client.tenant == "demo"
    assert f"public: {client.public_key}" in key.read_text()
    assert re.fullmatch(r"[0-9a-f]{32}", client.session_id)
    assert "attestation: PASS" in str(verdict)
    assert "demo" in repr(client)


def test_evidence_verifies_offline_and_is_bound_to_its_nonce(appliance, client):
    evidence = client.evidence
    assert isinstance(evidence, bytes) and len(evidence) > 100
    verdict = cloister.verify(evidence, appliance.policy)
    assert verdict.passed, str(verdict)
    assert verdict.claims["cvm.measurement"] == client.claims["cvm.measurement"]

    # The same evidence checked against another nonce fails, and says which check failed.
    other = cloister.verify(evidence, appliance.policy, nonce=bytes(32))
    assert not other.passed
    assert "evidence.nonce" in [check.name for check in other.failed_checks]

    # A flipped byte anywhere must not pass: it either does not parse or fails a check.
    tampered = bytearray(evidence)
    tampered[len(tampered) // 2] ^= 0x01
    try:
        assert not cloister.verify(bytes(tampered), appliance.policy).passed
    except cloister.InvalidArgument:
        pass


def test_fresh_evidence_is_collected_over_our_nonce(appliance, key, client):
    with cloister.connect(appliance.address, policy=appliance.policy, tenant="demo",
                          token=appliance.token, key=key, fresh=True) as fresh:
        assert fresh.verdict.passed, str(fresh.verdict)
        # Fresh evidence carries this client's nonce, so it differs from the cached bundle.
        assert fresh.claims["evidence.nonce"] != client.claims["evidence.nonce"]
        assert fresh.evidence != client.evidence
        assert cloister.verify(fresh.evidence, appliance.policy).passed


def test_attest_only_needs_no_key(appliance):
    verdict = cloister.attest(appliance.address, policy=appliance.policy, tenant="demo",
                              token=appliance.token)
    assert verdict.passed, str(verdict)


def test_upload_list_and_delete(client, work_dir):
    calls = []
    info = client.upload_model(model_path(CLS), "api-cls",
                               progress=lambda sent, total: calls.append((sent, total)))
    assert info.name == "api-cls"
    assert [t.name for t in info.inputs] == ["x"]
    assert info.inputs[0].datatype == "FP32"
    assert len(info.inputs[0].shape) == 4 and info.inputs[0].shape[1] == 3
    assert [t.name for t in info.outputs] == ["softmax_0.tmp_0"]
    # The classifier keeps rows apart, so batched requests share model runs.
    assert info.rows_coalesce and info.rows_shared_reason == ""
    # Progress: increasing, ending at the total ciphertext size (above the model's size).
    assert calls, "the progress callback was never called"
    sent = [s for s, _ in calls]
    assert sent == sorted(sent) and calls[-1][0] == calls[-1][1] > info.size

    # The same model from bytes, under another name.
    from_bytes = client.upload_model(model_path(CLS).read_bytes(), "api-cls-bytes")
    assert from_bytes.size == info.size and from_bytes.handle != info.handle

    names = {m.name: m for m in client.models()}
    assert {"api-cls", "api-cls-bytes"} <= set(names)
    assert names["api-cls"].handle == info.handle

    inputs, expected = reference_sets(CLS)[1]
    np.testing.assert_allclose(client.infer("api-cls-bytes", inputs)["softmax_0.tmp_0"],
                               expected["softmax_0.tmp_0"], rtol=1e-3, atol=1e-3)

    client.delete_model("api-cls-bytes")
    assert "api-cls-bytes" not in {m.name for m in client.models()}
    with pytest.raises(cloister.NotFound):
        client.infer("api-cls-bytes", inputs)
    assert "api-cls" in {m.name for m in client.models()}


def test_a_checkpoint_folder_uploads_as_an_llm(client, work_dir):
    folder = shared_dir() / "models" / "llm" / "tiny-llama"
    info = client.upload_model(folder, "api-tiny-llama")
    assert info.kind == "llm" and not info.inputs and not info.outputs
    assert re.fullmatch(r"[0-9a-f]{64}", info.digest)
    listed = {m.name: m for m in client.models()}
    assert listed["api-tiny-llama"].digest == info.digest
    assert listed["api-tiny-llama"].kind == "llm"
    with pytest.raises(cloister.FailedPrecondition, match="is a generative model: use Generate"):
        client.infer("api-tiny-llama", {"x": np.zeros(1, dtype=np.int32)})
    client.delete_model("api-tiny-llama")
    # A folder without a checkpoint is refused before anything is sent.
    empty = work_dir / "not-a-checkpoint"
    empty.mkdir(exist_ok=True)
    with pytest.raises(cloister.InvalidArgument, match="has no config.json"):
        client.upload_model(empty, "api-empty")


def test_an_exception_in_the_progress_callback_reaches_the_caller(client):
    def progress(sent, total):
        raise KeyError("stop here")

    with pytest.raises(KeyError, match="stop here"):
        client.upload_model(model_path(CLS), "api-callback", progress=progress)


def test_models_belong_to_the_identity_key(appliance, client, cls_model, work_dir):
    other_key = work_dir / "other-tenant-key.key"
    cloister.generate_key(other_key)
    with cloister.connect(appliance.address, policy=appliance.policy, tenant="demo",
                          token=appliance.token, key=other_key) as other:
        assert cls_model not in {m.name for m in other.models()}
        with pytest.raises(cloister.NotFound):
            other.infer(cls_model, reference_sets(CLS)[0][0])
        with pytest.raises(cloister.NotFound):
            other.delete_model(cls_model)
    assert cls_model in {m.name for m in client.models()}


def test_connect_reads_the_cli_environment(appliance, key, cls_model, monkeypatch):
    for name, value in appliance.env(key).items():
        if name.startswith("CLOISTER_"):
            monkeypatch.setenv(name, value)
    with cloister.connect() as client:
        assert client.verdict.passed
        assert cls_model in {m.name for m in client.models()}
    monkeypatch.delenv("CLOISTER_TENANT")
    with pytest.raises(cloister.InvalidArgument, match="tenant"):
        cloister.connect()


def test_every_error_class_is_exported_and_distinct():
    classes = [getattr(cloister, name) for name in cloister.__all__
               if isinstance(getattr(cloister, name), type)
               and issubclass(getattr(cloister, name), cloister.Error)]
    assert len(classes) == 18
    assert len({c for c in classes}) == len(classes)
    assert issubclass(cloister.InvalidArgument, ValueError)
    assert issubclass(cloister.DeadlineExceeded, TimeoutError)
    assert not issubclass(cloister.Error, RuntimeError)

"""Every failure reaches Python as a cloister.Error subclass that names its kind, with the
reason given by whoever refused (enclave, cloisterd or the client), never a bare RuntimeError."""

from __future__ import annotations

import os
import re
import socket

import numpy as np
import pytest

import cloister
from conftest import CLS, MAX_PAYLOAD_BYTES, REC, model_path, reference_sets


def connect(appliance, key, **overrides):
    settings = dict(server=appliance.address, policy=appliance.policy, tenant="demo",
                    token=appliance.token, key=key)
    settings.update(overrides)
    return cloister.connect(**settings)


def assert_one_line(error: cloister.Error):
    assert isinstance(error, cloister.Error)
    assert type(error) is not cloister.Error
    assert str(error) and "\n" not in str(error)
    assert error.message == str(error)


def test_attestation_error_lists_the_failed_checks(appliance, key, work_dir):
    # The development policy with a different enclave measurement pinned: the enclave that
    # runs is not the one this policy trusts.
    text = appliance.policy.read_text()
    measurements = re.findall(r"[0-9a-f]{96}", text)
    assert measurements, "the development policy pins no measurement"
    wrong = work_dir / "wrong-measurement-policy.yaml"
    wrong.write_text(text.replace(measurements[0], "ab" * 48))

    with pytest.raises(cloister.AttestationError) as caught:
        connect(appliance, key, policy=wrong)
    error = caught.value
    assert_one_line(error)
    assert error.code == "FAILED_PRECONDITION"
    assert error.verdict is not None and not error.verdict.passed
    assert error.failed_checks, "no failed check listed"
    assert all(check.result == "fail" for check in error.failed_checks)
    assert any("measurement" in check.name for check in error.failed_checks), error.failed_checks
    # The message names the failed checks too.
    assert error.failed_checks[0].name in str(error)

    # cloister.attest() reports the same verdict without raising.
    verdict = cloister.attest(appliance.address, policy=wrong, tenant="demo",
                              token=appliance.token)
    assert not verdict.passed
    assert [c.name for c in verdict.failed_checks] == [c.name for c in error.failed_checks]


def test_wrong_token_is_unauthenticated(appliance, key):
    with pytest.raises(cloister.Unauthenticated) as caught:
        connect(appliance, key, token="not-the-token")
    assert_one_line(caught.value)
    assert "wrong API token" in str(caught.value)
    assert caught.value.reason is None  # nothing a program could do but fix the token


def test_unknown_tenant_is_unauthenticated(appliance, key):
    with pytest.raises(cloister.Unauthenticated):
        connect(appliance, key, tenant="nobody")


def test_unreachable_server_is_unavailable(appliance, key):
    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(cloister.Unavailable) as caught:
        connect(appliance, key, server=f"127.0.0.1:{port}", timeout=10)
    assert_one_line(caught.value)
    assert isinstance(caught.value, ConnectionError)


def test_tls_settings_reach_the_connection(appliance, key, work_dir):
    with pytest.raises(cloister.NotFound, match="TLS CA file"):
        connect(appliance, key, ca=work_dir / "no-such-ca.pem")
    not_pem = work_dir / "not-a-ca.pem"
    not_pem.write_text("no certificate here\n")
    with pytest.raises(cloister.InvalidArgument, match="no PEM CERTIFICATE"):
        connect(appliance, key, ca=not_pem)
    with pytest.raises(cloister.InvalidArgument, match="CA file"):
        connect(appliance, key, client_cert=not_pem, client_key=not_pem)


def test_missing_key_is_not_found(appliance, work_dir):
    with pytest.raises(cloister.NotFound) as caught:
        connect(appliance, work_dir / "no-such.key")
    assert "keygen" in str(caught.value)


def test_key_readable_by_others_is_failed_precondition(appliance, work_dir):
    path = work_dir / "open.key"
    cloister.generate_key(path)
    os.chmod(path, 0o644)
    with pytest.raises(cloister.FailedPrecondition) as caught:
        connect(appliance, path)
    assert not isinstance(caught.value, cloister.AttestationError)
    assert "chmod 600" in str(caught.value)


def test_existing_key_file_is_already_exists(key):
    before = key.read_bytes()
    with pytest.raises(cloister.AlreadyExists):
        cloister.generate_key(key)
    assert key.read_bytes() == before


def test_key_where_it_cannot_be_created_is_permission_denied(work_dir):
    if os.geteuid() == 0:
        # root may write anywhere the permission bits forbid; sysfs refuses new files to
        # everyone with EACCES.
        path = "/sys/cloister-test.key"
    else:
        locked = work_dir / "locked"
        locked.mkdir()
        os.chmod(locked, 0o500)
        path = locked / "tenant.key"
    with pytest.raises(cloister.PermissionDenied) as caught:
        cloister.generate_key(path)
    assert_one_line(caught.value)
    assert isinstance(caught.value, PermissionError)


def test_unknown_model_is_not_found(client):
    with pytest.raises(cloister.NotFound) as caught:
        client.infer("no-such-model", {"x": np.zeros((1, 3, 48, 192), np.float32)})
    assert_one_line(caught.value)
    with pytest.raises(cloister.NotFound):
        client.delete_model("no-such-model")
    with pytest.raises(cloister.NotFound):
        client.upload_model("/nonexistent/model.onnx", "x")


def test_bad_inputs_are_invalid_argument(client, cls_model):
    good = reference_sets(CLS)[0][0]["x"]
    cases = {
        "wrong input name": {"y": good},
        "wrong datatype": {"x": good.astype(np.float64)},
        "wrong rank": {"x": good[0]},
        "wrong channel count": {"x": np.zeros((1, 4, 48, 192), np.float32)},
    }
    for what, inputs in cases.items():
        with pytest.raises(cloister.InvalidArgument) as caught:
            client.infer(cls_model, inputs)
        assert_one_line(caught.value)
        assert isinstance(caught.value, ValueError), what
    # After all of that the session still works.
    outputs = client.infer(cls_model, {"x": good})
    assert outputs["softmax_0.tmp_0"].shape == (1, 2)


def test_local_checks_are_invalid_argument(appliance, client, cls_model):
    x = reference_sets(CLS)[0][0]["x"]
    with pytest.raises(cloister.InvalidArgument, match="complex64"):
        client.infer(cls_model, {"x": x.astype(np.complex64)})
    with pytest.raises(cloister.InvalidArgument, match="model name is empty"):
        client.infer("", {"x": x})
    with pytest.raises(cloister.InvalidArgument, match="no input tensors"):
        client.infer(cls_model, {})
    with pytest.raises(cloister.InvalidArgument, match="timeout"):
        client.infer(cls_model, {"x": x}, timeout=-1)
    with pytest.raises(cloister.InvalidArgument, match="model name is empty"):
        client.upload_model(b"not a model", "")
    with pytest.raises(cloister.InvalidArgument, match="evidence"):
        cloister.verify(b"\xff\xff not evidence", appliance.policy)


def test_uploading_a_taken_name_is_already_exists(client, cls_model):
    with pytest.raises(cloister.AlreadyExists) as caught:
        client.upload_model(model_path(CLS), cls_model)
    assert_one_line(caught.value)
    assert cls_model in str(caught.value)


def test_a_file_that_is_no_model_is_refused_by_the_enclave(client):
    with pytest.raises(cloister.InvalidArgument) as caught:
        client.upload_model(b"this is not an ONNX model", "garbage")
    assert_one_line(caught.value)
    assert "garbage" not in [m.name for m in client.models()]


def test_oversized_payload_is_resource_exhausted(client, cls_model):
    width = MAX_PAYLOAD_BYTES // (3 * 48 * 4) + 64  # one float32 image over the limit
    big = np.zeros((1, 3, 48, width), np.float32)
    with pytest.raises(cloister.ResourceExhausted) as caught:
        client.infer(cls_model, {"x": big})
    assert_one_line(caught.value)
    assert f"limit of {MAX_PAYLOAD_BYTES} bytes" in str(caught.value)
    # cloisterd says why in the gRPC status details, for programs to decide by.
    assert caught.value.reason == "TOO_LARGE"


def test_too_short_timeout_is_deadline_exceeded(client, rec_model):
    x = np.repeat(reference_sets(REC)[0][0]["x"], 4, axis=0)
    with pytest.raises(cloister.DeadlineExceeded) as caught:
        client.infer(rec_model, {"x": x}, timeout=0.001)
    assert_one_line(caught.value)
    assert isinstance(caught.value, TimeoutError)
    # The client recovers: the next call with the default timeout succeeds.
    assert client.infer(rec_model, {"x": x[:1]})["softmax_11.tmp_0"].shape[0] == 1


def test_closed_client_is_failed_precondition(appliance, key):
    c = connect(appliance, key)
    c.close()
    assert c.closed
    with pytest.raises(cloister.FailedPrecondition, match="closed"):
        c.models()

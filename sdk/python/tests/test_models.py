"""Every shared model through the appliance from Python: upload, then every reference set of
models/testdata must come back within the shared tolerance, as numpy arrays of the right
dtype and shape."""

from __future__ import annotations

import numpy as np
import pytest

import cloister
from conftest import SHARED_MODELS, assert_matches_reference, model_path, reference_sets


@pytest.mark.parametrize("name", sorted(SHARED_MODELS))
def test_every_reference_set_round_trips(client, name):
    if name in {m.name for m in client.models()}:
        client.delete_model(name)
    info = client.upload_model(model_path(name), name)
    assert info.name == name
    assert info.size == model_path(name).stat().st_size
    assert info.inputs and info.outputs

    for set_index, (inputs, expected) in enumerate(reference_sets(name)):
        assert set(inputs) <= {t.name for t in info.inputs}
        outputs = client.infer(name, inputs)
        # All outputs, in the model's output order.
        assert list(outputs) == [t.name for t in info.outputs]
        for output_name, reference in expected.items():
            assert_matches_reference(outputs[output_name], reference,
                                     f"{name} set {set_index} output {output_name}")
        # Asking for one output returns only that one, with the same values.
        first = next(iter(expected))
        only = client.infer(name, inputs, outputs=[first])
        assert list(only) == [first]
        np.testing.assert_array_equal(only[first], outputs[first])


def test_returned_arrays_are_writable_and_independent(client, cls_model):
    inputs, expected = reference_sets(cls_model)[0]
    first = client.infer(cls_model, inputs)
    second = client.infer(cls_model, inputs)
    (name,) = expected
    first[name][...] = 0  # numpy owns a copy: writing it changes nothing else
    assert_matches_reference(second[name], expected[name], "second call")


def test_inputs_accept_array_likes_and_big_endian_arrays(client):
    name = "silero_vad_op18_ifless"
    if name not in {m.name for m in client.models()}:
        client.upload_model(model_path(name), name)
    inputs, expected = reference_sets(name)[0]
    converted = {
        "input": inputs["input"].astype(">f4"),  # big-endian: converted on the way
        "sr": int(inputs["sr"]),                 # a Python int becomes int64
        "state": inputs["state"].tolist(),       # nested lists would be float64 ...
    }
    with pytest.raises(cloister.InvalidArgument):
        client.infer(name, converted)
    converted["state"] = np.asarray(converted["state"], dtype=np.float32)  # ... so say float32
    outputs = client.infer(name, converted)
    for output_name, reference in expected.items():
        assert_matches_reference(outputs[output_name], reference, output_name)

"""The examples in examples/ run as a user runs them (a separate python3 process, settings from
the CLOISTER_* environment) against the test appliance, and print what the shared samples
hold."""

from __future__ import annotations

import re
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest

from conftest import examples_dir, models_dir

CHUNK_SECONDS = 512 / 16000


@pytest.fixture(scope="module")
def example_env(appliance, key):
    env = appliance.env(key)
    env["CLOISTER_MODELS_DIR"] = str(models_dir())
    return env


def run_example(env, script, *args):
    result = subprocess.run([sys.executable, str(examples_dir() / script), *map(str, args)],
                            env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def write_png(path, rgb: np.ndarray) -> None:
    """An 8-bit RGB PNG, every row with filter type 0."""
    height, width, _ = rgb.shape
    rows = b"".join(b"\x00" + rgb[y].astype(np.uint8).tobytes() for y in range(height))

    def chunk(kind, body):
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF))

    path.write_bytes(b"\x89PNG\r\n\x1a\n"
                     + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def test_ocr_reads_the_sample_line(example_env):
    result = run_example(example_env, "ocr.py", models_dir() / "samples" / "rec_text.png")
    assert result.stdout == "Hello World 2026\n", result.stderr
    assert "upright" in result.stderr


def test_ocr_turns_an_upside_down_line(example_env, work_dir):
    # The sample read back by the example's own PNG reader, turned by 180 degrees.
    sys.path.insert(0, str(examples_dir()))
    try:
        import ocr
    finally:
        sys.path.pop(0)
    upright = ocr.read_png(str(models_dir() / "samples" / "rec_text.png"))
    turned = work_dir / "rec_text_turned.png"
    write_png(turned, upright[::-1, ::-1])
    result = run_example(example_env, "ocr.py", turned)
    assert result.stdout == "Hello World 2026\n", result.stderr
    assert "rotated 180" in result.stderr


def test_ocr_reads_the_classifier_sample(example_env):
    result = run_example(example_env, "ocr.py", models_dir() / "samples" / "cls_text.png")
    assert result.stdout == "Hello 42\n", result.stderr


def test_vad_finds_the_speech(example_env):
    # With 1 s of silence on each side, as in the reference sets: speech from about 1.06 s
    # to 6.82 s (models/README.md), within two chunks.
    result = run_example(example_env, "vad.py", "--pad", "1",
                         models_dir() / "samples" / "speech22k.wav")
    segments = [tuple(map(float, m)) for m in
                re.findall(r"^speech ([0-9.]+) s - ([0-9.]+) s$", result.stdout, re.M)]
    assert segments, result.stdout + result.stderr
    assert abs(segments[0][0] - 1.06) <= 2 * CHUNK_SECONDS, segments
    assert abs(segments[-1][1] - 6.82) <= 2 * CHUNK_SECONDS, segments
    assert all(start < end for start, end in segments)

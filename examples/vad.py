#!/usr/bin/env python3
"""Finds where people speak in a WAV file with Silero VAD, run encrypted in Cloister.

The audio is streamed to the attested enclave in 32 ms chunks (512 samples at 16 kHz, plus 64
samples of context from the previous chunk), each encrypted end to end; the model's recurrent
state comes back with every answer and goes out with the next chunk.

    python3 examples/vad.py --models-dir SHARED/models SHARED/models/samples/speech22k.wav

Connection settings come from the same environment variables as the `cloister` CLI
(CLOISTER_SERVER, CLOISTER_POLICY, CLOISTER_TENANT, CLOISTER_TOKEN_FILE, CLOISTER_KEY) or from
the flags below. The model is uploaded the first time (as vad). Prints one line per speech
segment, "speech START s - END s".
"""

from __future__ import annotations

import argparse
import os
import sys
import wave
from pathlib import Path

import numpy as np

import cloister

MODEL_NAME = "vad"
MODEL_FILE = "vad/silero_vad_op18_ifless.onnx"
RATE = 16000
CHUNK = 512    # new samples per call: 32 ms
CONTEXT = 64   # samples carried over from the previous chunk


def read_wav(path: str) -> np.ndarray:
    """A 16-bit PCM WAV file as float32 samples in [-1, 1) at 16 kHz (first channel;
    other rates are resampled linearly)."""
    with wave.open(path, "rb") as f:
        if f.getsampwidth() != 2:
            raise ValueError(f"{path}: only 16-bit PCM WAV files are supported")
        rate, channels = f.getframerate(), f.getnchannels()
        frames = np.frombuffer(f.readframes(f.getnframes()), "<i2")
    samples = frames.reshape(-1, channels)[:, 0].astype(np.float32) / 32768.0
    if rate != RATE:
        duration = len(samples) / rate
        grid = np.arange(0, duration, 1.0 / RATE)
        samples = np.interp(grid, np.arange(len(samples)) / rate, samples).astype(np.float32)
    return samples


def speech_probabilities(client: cloister.Client, samples: np.ndarray) -> np.ndarray:
    """One speech probability per 32 ms chunk."""
    state = np.zeros((2, 1, 128), np.float32)
    sample_rate = np.array(RATE, np.int64)
    window = np.zeros(CONTEXT + CHUNK, np.float32)
    probabilities = []
    for start in range(0, len(samples) - CHUNK + 1, CHUNK):
        window[:CONTEXT] = window[-CONTEXT:]
        window[CONTEXT:] = samples[start:start + CHUNK]
        out = client.infer(MODEL_NAME, {"input": window[None, :], "sr": sample_rate,
                                        "state": state})
        probabilities.append(float(out["output"][0, 0]))
        state = out["stateN"]
    return np.array(probabilities, np.float32)


def segments(probabilities: np.ndarray, threshold: float, min_silence: float) -> list:
    """(start, end) in seconds of the runs of chunks at or above `threshold`, joining runs
    separated by less than `min_silence` seconds."""
    chunk_seconds = CHUNK / RATE
    found = []
    for index in np.flatnonzero(probabilities >= threshold):
        start, end = index * chunk_seconds, (index + 1) * chunk_seconds
        if found and start - found[-1][1] < min_silence:
            found[-1] = (found[-1][0], end)
        else:
            found.append((start, end))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("wav", help="a 16-bit PCM WAV file")
    parser.add_argument("--models-dir", default=os.environ.get("CLOISTER_MODELS_DIR"),
                        help="the folder with vad/ (default: $CLOISTER_MODELS_DIR)")
    parser.add_argument("--threshold", type=float, default=0.5,
                        help="speech probability that counts as speech (default 0.5)")
    parser.add_argument("--min-silence", type=float, default=0.3,
                        help="shorter pauses do not split a segment (seconds, default 0.3)")
    parser.add_argument("--pad", type=float, default=0.0,
                        help="seconds of silence to add before and after the audio")
    parser.add_argument("--server", help="cloisterd HOST:PORT (default: $CLOISTER_SERVER)")
    parser.add_argument("--policy", help="attestation policy (default: $CLOISTER_POLICY)")
    parser.add_argument("--tenant", help="tenant id (default: $CLOISTER_TENANT)")
    parser.add_argument("--token-file", help="API token file (default: $CLOISTER_TOKEN_FILE)")
    parser.add_argument("--key", help="identity key (default: $CLOISTER_KEY)")
    args = parser.parse_args()
    if not args.models_dir:
        parser.error("--models-dir (or CLOISTER_MODELS_DIR) is needed")

    samples = read_wav(args.wav)
    if args.pad > 0:
        silence = np.zeros(int(args.pad * RATE), np.float32)
        samples = np.concatenate([silence, samples, silence])

    token = Path(args.token_file).read_text().strip() if args.token_file else None
    try:
        with cloister.connect(args.server, policy=args.policy, tenant=args.tenant, token=token,
                              key=args.key) as client:
            if MODEL_NAME not in {model.name for model in client.models()}:
                client.upload_model(Path(args.models_dir) / MODEL_FILE, MODEL_NAME)
            probabilities = speech_probabilities(client, samples)
    except cloister.Error as e:
        print(f"vad: {type(e).__name__}: {e}", file=sys.stderr)
        return 1

    found = segments(probabilities, args.threshold, args.min_silence)
    print(f"{len(probabilities)} chunks of {CHUNK / RATE * 1000:.0f} ms, "
          f"{len(found)} speech segment(s)", file=sys.stderr)
    for start, end in found:
        print(f"speech {start:.2f} s - {end:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

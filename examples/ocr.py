#!/usr/bin/env python3
"""Reads the text of a one-line image with PaddleOCR's models, run encrypted in Cloister.

The image never leaves this machine in the clear: it is encrypted to the attested enclave,
which runs the text-direction classifier (is the line upside down?) and then the recogniser,
and sends back encrypted posteriors that are decoded here.

    python3 examples/ocr.py --models-dir SHARED/models SHARED/models/samples/rec_text.png

Connection settings come from the same environment variables as the `cloister` CLI
(CLOISTER_SERVER, CLOISTER_POLICY, CLOISTER_TENANT, CLOISTER_TOKEN_FILE, CLOISTER_KEY) or from
the flags below. The models are uploaded the first time (as ocr-cls and ocr-rec). Prints the
text on stdout; the orientation and the confidence go to stderr.

Needs only numpy (the PNG reader below is a small one for 8-bit, non-interlaced images).
"""

from __future__ import annotations

import argparse
import math
import os
import struct
import sys
import zlib
from pathlib import Path

import numpy as np

import cloister

CLS_NAME, REC_NAME = "ocr-cls", "ocr-rec"
CLS_FILE = "ocr/ch_ppocr_mobile_v2.0_cls_infer.onnx"
REC_FILE = "ocr/ch_PP-OCRv4_rec_infer.onnx"
DICTIONARY_FILE = "ocr/ppocr_keys_v1.txt"
HEIGHT = 48           # both models take 48-pixel-high lines
CLS_WIDTH = 192       # the classifier's input width
REC_MIN_WIDTH = 320   # the recogniser's usual width; wider lines keep their aspect ratio


# ---- A minimal PNG reader (8-bit grey, grey+alpha, RGB or RGBA; not interlaced). ----

def read_png(path: str) -> np.ndarray:
    """The image as uint8 RGB, shape (height, width, 3)."""
    data = Path(path).read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path} is not a PNG file")
    at, idat, header = 8, [], None
    while at + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
        at += 12 + length
    if header is None:
        raise ValueError(f"{path} has no IHDR chunk")
    width, height, depth, color, _, _, interlace = header
    channels = {0: 1, 2: 3, 4: 2, 6: 4}.get(color)
    if depth != 8 or channels is None or interlace != 0:
        raise ValueError(f"{path}: only 8-bit non-interlaced grey/RGB(A) PNGs are supported")
    raw = zlib.decompress(b"".join(idat))
    stride = width * channels
    rows = np.zeros((height, stride), np.uint8)
    previous = np.zeros(stride, np.int32)
    for y in range(height):
        start = y * (stride + 1)
        kind = raw[start]
        line = np.frombuffer(raw, np.uint8, stride, start + 1).astype(np.int32)
        if kind == 0:
            out = line
        elif kind == 2:  # Up
            out = (line + previous) & 0xFF
        else:  # Sub, Average, Paeth depend on the pixel to the left: go byte by byte
            out = np.zeros(stride, np.int32)
            for i in range(stride):
                left = out[i - channels] if i >= channels else 0
                up = previous[i]
                if kind == 1:
                    predictor = left
                elif kind == 3:
                    predictor = (left + up) >> 1
                elif kind == 4:
                    up_left = previous[i - channels] if i >= channels else 0
                    p = left + up - up_left
                    pa, pb, pc = abs(p - left), abs(p - up), abs(p - up_left)
                    predictor = left if pa <= pb and pa <= pc else (up if pb <= pc else up_left)
                else:
                    raise ValueError(f"{path}: bad PNG filter type {kind}")
                out[i] = (line[i] + predictor) & 0xFF
        rows[y] = out
        previous = out
    pixels = rows.reshape(height, width, channels)
    if channels in (1, 2):
        return np.repeat(pixels[:, :, :1], 3, axis=2)
    return pixels[:, :, :3]


# ---- Pre- and post-processing as PaddleOCR does it. ----

def resize(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bilinear resize of an (H, W, C) float image."""
    h, w = image.shape[:2]
    ys = np.clip((np.arange(height) + 0.5) * h / height - 0.5, 0, h - 1)
    xs = np.clip((np.arange(width) + 0.5) * w / width - 0.5, 0, w - 1)
    y0, x0 = np.floor(ys).astype(int), np.floor(xs).astype(int)
    y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
    fy, fx = (ys - y0)[:, None, None], (xs - x0)[None, :, None]
    top = image[y0][:, x0] * (1 - fx) + image[y0][:, x1] * fx
    bottom = image[y1][:, x0] * (1 - fx) + image[y1][:, x1] * fx
    return top * (1 - fy) + bottom * fy


def model_input(image: np.ndarray, width: int) -> np.ndarray:
    """A line resized to HEIGHT (keeping its aspect ratio, at most `width` wide), scaled to
    [-1, 1], padded on the right to `width`: float32 (1, 3, HEIGHT, width)."""
    h, w = image.shape[:2]
    resized_width = min(width, max(1, math.ceil(HEIGHT * w / h)))
    line = resize(image.astype(np.float32), HEIGHT, resized_width)
    line = (line / 255.0 - 0.5) / 0.5
    out = np.zeros((1, 3, HEIGHT, width), np.float32)
    out[0, :, :, :resized_width] = line.transpose(2, 0, 1)
    return out


def ctc_decode(posteriors: np.ndarray, dictionary: list) -> tuple:
    """Greedy CTC: best class per step, repeats collapsed, blanks (class 0) dropped. Classes
    1..len(dictionary) are dictionary lines, the one after them a space."""
    best = posteriors.argmax(axis=-1)
    scores = posteriors.max(axis=-1)
    text, confidences, previous = [], [], -1
    for step, label in enumerate(best):
        if label != previous and label != 0:
            text.append(dictionary[label - 1] if label <= len(dictionary) else " ")
            confidences.append(float(scores[step]))
        previous = label
    return "".join(text), (float(np.mean(confidences)) if confidences else 0.0)


def ensure_model(client: cloister.Client, name: str, path: Path) -> None:
    if name not in {model.name for model in client.models()}:
        info = client.upload_model(path, name)
        print(f"uploaded {path.name} as {name} ({info.size} bytes)", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("image", help="a PNG image of one line of text")
    parser.add_argument("--models-dir", default=os.environ.get("CLOISTER_MODELS_DIR"),
                        help="the folder with ocr/ (default: $CLOISTER_MODELS_DIR)")
    parser.add_argument("--server", help="cloisterd HOST:PORT (default: $CLOISTER_SERVER)")
    parser.add_argument("--policy", help="attestation policy (default: $CLOISTER_POLICY)")
    parser.add_argument("--tenant", help="tenant id (default: $CLOISTER_TENANT)")
    parser.add_argument("--token-file", help="API token file (default: $CLOISTER_TOKEN_FILE)")
    parser.add_argument("--key", help="identity key (default: $CLOISTER_KEY)")
    args = parser.parse_args()
    if not args.models_dir:
        parser.error("--models-dir (or CLOISTER_MODELS_DIR) is needed")
    models = Path(args.models_dir)
    dictionary = (models / DICTIONARY_FILE).read_text(encoding="utf-8").splitlines()
    image = read_png(args.image)

    token = Path(args.token_file).read_text().strip() if args.token_file else None
    try:
        with cloister.connect(args.server, policy=args.policy, tenant=args.tenant, token=token,
                              key=args.key) as client:
            ensure_model(client, CLS_NAME, models / CLS_FILE)
            ensure_model(client, REC_NAME, models / REC_FILE)

            # 1. Text direction: class 0 upright, class 1 turned by 180 degrees.
            (direction,) = client.infer(CLS_NAME, {"x": model_input(image, CLS_WIDTH)}).values()
            rotated = direction[0, 1] > 0.9
            if rotated:
                image = image[::-1, ::-1]

            # 2. Recognition, as wide as the line needs.
            h, w = image.shape[:2]
            width = max(REC_MIN_WIDTH, math.ceil(HEIGHT * w / h))
            (posteriors,) = client.infer(REC_NAME, {"x": model_input(image, width)}).values()
    except cloister.AttestationError as e:
        print(f"ocr: the appliance failed attestation: {e}", file=sys.stderr)
        for check in e.failed_checks:
            print(f"  {check.name}: {check.detail}", file=sys.stderr)
        return 1
    except cloister.Error as e:
        print(f"ocr: {type(e).__name__}: {e}", file=sys.stderr)
        return 1

    text, confidence = ctc_decode(posteriors[0], dictionary)
    print(f"orientation: {'rotated 180' if rotated else 'upright'} "
          f"(p={direction[0].max():.3f}), confidence {confidence:.3f}", file=sys.stderr)
    print(text.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())

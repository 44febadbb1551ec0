"""The PEP 517 build backend of the `cloister` package: builds the wheel offline with the
standard library only, so that `pip install ./sdk/python` needs nothing from a package index.

The extension module is the project's CMake target `cloister_python` (pybind11 over the C++
SDK), built in the project's build folder: $CLOISTER_BUILD_DIR, default <repo>/build, which is
configured first when it does not exist yet (tests off). When that folder was configured for a
Python with another ABI, it is pointed at the Python running pip. The wheel holds the package
sources, the module and the metadata.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
PACKAGE = HERE / "cloister"
NAME = "cloister"
SUMMARY = "Confidential inference client: attestation, encrypted sessions, numpy in and out"


def _version() -> str:
    text = (PACKAGE / "__init__.py").read_text(encoding="utf-8")
    match = re.search(r'^__version__ = "([^"]+)"', text, re.M)
    if match is None:
        raise RuntimeError("cloister/__init__.py sets no __version__")
    return match.group(1)


def _tag() -> str:
    interpreter = f"cp{sys.version_info.major}{sys.version_info.minor}"
    abi = interpreter + sys.abiflags
    platform = re.sub(r"[-.]", "_", sysconfig.get_platform())
    return f"{interpreter}-{abi}-{platform}"


def _build_dir() -> Path:
    return Path(os.environ.get("CLOISTER_BUILD_DIR", REPO / "build")).resolve()


def _build_module() -> Path:
    """Builds cloister._native for this Python and returns its path."""
    build = _build_dir()
    module = build / "python" / "cloister" / ("_native" + sysconfig.get_config_var("EXT_SUFFIX"))

    # The interpreter itself, not a virtual environment's link to it (same ABI and headers),
    # so that the build folder keeps working when the environment is gone.
    python = getattr(sys, "_base_executable", None) or sys.executable

    def configure(*extra: str) -> None:
        subprocess.run(["cmake", "-S", str(REPO), "-B", str(build),
                        f"-DPython_EXECUTABLE={python}", *extra], check=True)

    def compile_module() -> None:
        subprocess.run(["cmake", "--build", str(build), "--target", "cloister_python"],
                       check=True)

    if not (build / "CMakeCache.txt").exists():
        configure("-G", "Ninja", "-DCMAKE_BUILD_TYPE=RelWithDebInfo", "-DCLOISTER_BUILD_TESTS=OFF")
    compile_module()
    if not module.exists():
        configure()  # configured for another Python ABI: use this one
        compile_module()
    if not module.exists():
        raise RuntimeError(f"the build left no {module.name} in {module.parent}")
    return module


def _without_debug_info(module: Path) -> bytes:
    """The module's bytes, with its debug sections stripped when `strip` is at hand (the
    build keeps them; the wheel does not need them)."""
    strip = shutil.which("strip")
    if strip is None:
        return module.read_bytes()
    with tempfile.TemporaryDirectory() as scratch:
        stripped = Path(scratch) / module.name
        subprocess.run([strip, "--strip-debug", "-o", str(stripped), str(module)], check=True)
        return stripped.read_bytes()


def _metadata() -> str:
    readme = (HERE / "README.md").read_text(encoding="utf-8")
    return (
        "Metadata-Version: 2.1\n"
        f"Name: {NAME}\n"
        f"Version: {_version()}\n"
        f"Summary: {SUMMARY}\n"
        "Requires-Python: >=3.9\n"
        "Requires-Dist: numpy\n"
        "Description-Content-Type: text/markdown\n"
        "\n" + readme
    )


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


# ---- PEP 517 hooks. ----

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    module = _build_module()
    version = _version()
    tag = _tag()
    dist_info = f"{NAME}-{version}.dist-info"
    files = {}
    for source in sorted(PACKAGE.iterdir()):
        if source.is_file() and (source.suffix == ".py" or source.name == "py.typed"):
            files[f"{NAME}/{source.name}"] = source.read_bytes()
    files[f"{NAME}/{module.name}"] = _without_debug_info(module)
    files[f"{dist_info}/METADATA"] = _metadata().encode()
    files[f"{dist_info}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: cloister build_backend\nRoot-Is-Purelib: false\n"
        f"Tag: {tag}\n"
    ).encode()
    files[f"{dist_info}/top_level.txt"] = f"{NAME}\n".encode()
    record = [_record_line(path, data) for path, data in files.items()]
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()

    wheel_name = f"{NAME}-{version}-{tag}.whl"
    with zipfile.ZipFile(Path(wheel_directory) / wheel_name, "w", zipfile.ZIP_DEFLATED) as wheel:
        for path, data in files.items():
            info = zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if path.endswith(".so") else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(info, data)
    return wheel_name


def build_sdist(sdist_directory, config_settings=None):
    raise RuntimeError(
        "cloister has no source distribution: it builds from the repository with CMake "
        "(pip install ./sdk/python)"
    )

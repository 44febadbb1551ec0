"""`pip install ./sdk/python` works offline: into a fresh virtual environment, with no package
index, it builds the wheel from this build folder ($CLOISTER_BUILD_DIR) and the installed
package imports and works outside the source and build trees."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parent.parent


def test_pip_installs_the_package_offline(tmp_path):
    build_dir = os.environ.get("CLOISTER_BUILD_DIR")
    if not build_dir:
        pytest.fail("CLOISTER_BUILD_DIR is not set; run these tests through ctest (label python)")
    venv = tmp_path / "venv"
    # No pip inside the environment (that only costs time): this Python's pip installs into it.
    made = subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages",
                           str(venv)], capture_output=True, text=True)
    assert made.returncode == 0, "python3 -m venv failed (python3-venv installed?): " + made.stderr

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(CLOISTER_BUILD_DIR=build_dir, PIP_NO_INDEX="1", PIP_NO_CACHE_DIR="1",
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    python = str(venv / "bin" / "python")
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", python,
                                "install", "--no-index", str(SOURCE)],
                               env=env, capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stdout + installed.stderr

    key = tmp_path / "installed.key"
    check = subprocess.run(
        [python, "-c",
         "import sys, cloister; print(cloister.__file__); "
         "print(cloister.generate_key(sys.argv[1]))",
         str(key)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr
    location, public_key = check.stdout.split()
    assert Path(location).is_relative_to(venv), location
    assert len(public_key) == 64 and key.exists()
    # The wheel holds the typing marker and the module next to the sources.
    package = Path(location).parent
    assert (package / "py.typed").exists()
    assert list(package.glob("_native*.so"))

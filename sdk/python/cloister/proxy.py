"""``python3 -m cloister.proxy [--listen HOST:PORT] [--api-key-file FILE] [connection flags]``

Runs ``cloister proxy``, the OpenAI-compatible API on this machine (docs/OPENAI.md), with the
arguments given: it replaces this process with the ``cloister`` program, so signals (Ctrl-C,
SIGTERM) and the exit status are the program's own. The program is looked for in
``$CLOISTER_CLI``, then beside the package (``cloister/bin/cloister``, or the build folder's
``bin/cloister`` when the package is the build's ``python/cloister``), then on ``PATH``.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import List, Optional


def find_cli() -> Optional[str]:
    """The path of the ``cloister`` program, or None when there is none to be found."""
    override = os.environ.get("CLOISTER_CLI")
    if override:
        return override
    here = Path(__file__).resolve().parent
    for candidate in (here / "bin" / "cloister", here.parent.parent / "bin" / "cloister"):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("cloister")


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    cli = find_cli()
    if cli is None:
        print("cloister.proxy: the `cloister` program is neither beside the package nor on PATH "
              "(build it, or set CLOISTER_CLI to its path)", file=sys.stderr)
        return 2
    sys.stdout.flush()
    try:
        os.execv(cli, [cli, "proxy", *args])
    except OSError as e:
        print(f"cloister.proxy: cannot run {cli}: {e.strerror}", file=sys.stderr)
        return 2
    return 0  # not reached: execv does not return


if __name__ == "__main__":
    sys.exit(main())

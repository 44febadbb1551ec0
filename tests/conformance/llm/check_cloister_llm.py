#!/usr/bin/env python3
"""cloister-llm as a user runs it, against the shared tiny model's references.

    check_cloister_llm.py CLOISTER_LLM MODEL_DIR

For every prompt of MODEL_DIR/reference.json: `run --chat FILE` (chat prompts, rendered by the
model's template) or `run --prompt TEXT` (plain prompts, BOS added) must give the reference's
prompt ids, greedy ids, text and stop reason; `run --prompt-ids` must give the same ids;
`tokenize` the same prompt ids. Then the refusals: their exit codes and one-line messages.
Prints "N passed, M failed" and exits 1 if any check failed.
"""
import json
import os
import subprocess
import sys
import tempfile

tool, model = sys.argv[1], sys.argv[2]
reference = json.load(open(os.path.join(model, "reference.json")))
passed = failed = 0


def check(name, condition, detail=""):
    global passed, failed
    if condition:
        passed += 1
    else:
        failed += 1
        print(f"FAIL {name}: {detail}")


def run(*args):
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=300)


with tempfile.TemporaryDirectory() as scratch:
    for index, prompt in enumerate(reference["prompts"]):
        name = prompt["name"]
        if prompt["kind"] == "chat":
            chat = os.path.join(scratch, f"{index}.json")
            json.dump(prompt["messages"], open(chat, "w"))
            source = ["--chat", chat]
            tokenize = ["--chat", chat]
        else:
            source = ["--prompt", prompt["text"]]
            tokenize = ["--text", prompt["text"]]
        done = run("run", "--model", model, *source, "--max-tokens", "48", "--json")
        check(f"{name} exit", done.returncode == 0, done.stderr)
        if done.returncode != 0:
            continue
        out = json.loads(done.stdout)
        check(f"{name} prompt_ids", out["prompt_ids"] == prompt["prompt_ids"], out["prompt_ids"])
        check(f"{name} ids", out["ids"] == prompt["generated_ids"], out["ids"])
        check(f"{name} text", out["text"] == prompt["generated_text"], repr(out["text"]))
        want = "stop" if prompt["stop"] == "eos" else "length"
        check(f"{name} finish_reason", out["finish_reason"] == want, out["finish_reason"])
        check(f"{name} rates", out["prefill_tokens_per_s"] > 0 and out["decode_tokens_per_s"] > 0,
              out)
        ids = ",".join(str(i) for i in prompt["prompt_ids"])
        again = run("run", "--model", model, "--prompt-ids", ids, "--max-tokens", "48",
                    "--threads", "2", "--json")
        check(f"{name} --prompt-ids", again.returncode == 0 and
              json.loads(again.stdout)["ids"] == prompt["generated_ids"], again.stderr)
        tok = run("tokenize", "--model", model, *tokenize, "--json")
        check(f"{name} tokenize", tok.returncode == 0 and
              json.loads(tok.stdout) == {"ids": prompt["prompt_ids"]}, tok.stdout + tok.stderr)

    # Refusals: exit 1 for a refused request, 2 for bad usage or unreadable input; one line.
    long_ids = ",".join(["72"] * 512)
    cases = [
        ("prompt past the context", ["run", "--model", model, "--prompt-ids", long_ids], 1,
         "the prompt has 512 tokens"),
        ("max_tokens past the context", ["run", "--model", model, "--prompt-ids", "72,73",
                                         "--max-tokens", "600"], 1, "runs past the model's context"),
        ("temperature out of range", ["run", "--model", model, "--prompt", "x",
                                      "--temperature", "3"], 1, "temperature"),
        ("no model folder", ["run", "--model", os.path.join(scratch, "none"), "--prompt", "x"], 2,
         "config.json"),
        ("two prompts", ["run", "--model", model, "--prompt", "x", "--prompt-ids", "1"], 2,
         "exactly one of"),
        ("unknown flag", ["tokenize", "--model", model, "--text", "x", "--seed", "1"], 2,
         "unknown option --seed"),
        ("bad id list", ["run", "--model", model, "--prompt-ids", "1,x"], 2, "is not a token id"),
    ]
    # --executor cuda: refused in one line without a device (or a CUDA build), else it runs there.
    done = run("run", "--model", model, "--prompt", "x", "--max-tokens", "2", "--executor", "cuda",
               "--json")
    first = done.stderr.splitlines()[0] if done.stderr else ""
    if done.returncode == 0:
        check("cuda", json.loads(done.stdout)["executor"] == "cuda", done.stdout)
    else:
        check("cuda", done.returncode == 1 and "cuda" in first.lower(),
              f"exit {done.returncode}, stderr {done.stderr!r}")
    for name, args, code, text in cases:
        done = run(*args)
        first = done.stderr.splitlines()[0] if done.stderr else ""
        check(name, done.returncode == code and text in first,
              f"exit {done.returncode}, stderr {done.stderr!r}")

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)

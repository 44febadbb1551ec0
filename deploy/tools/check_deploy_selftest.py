#!/usr/bin/env python3
"""Shows that check_deploy.py can fail: breaks copies of deploy/ in the ways an edit might
(a missing resource, a probe on an undeclared port, a patch for an object that is not there,
a drifted policy copy, a bad ExecStart) and expects each to be reported."""

import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def run_check(deploy, policies):
    return subprocess.run([sys.executable, os.path.join(HERE, "check_deploy.py"), "--deploy", deploy,
                           "--policies", policies, "--no-kubectl"],
                          capture_output=True, text=True, timeout=120)


def edit(path, old, new):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    assert old in text, (path, old)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text.replace(old, new, 1))


BREAKAGES = [
    ("missing resource", lambda d: os.remove(os.path.join(d, "kubernetes/base/service.yaml")),
     "resources: service.yaml does not exist"),
    ("probe port", lambda d: edit(os.path.join(d, "kubernetes/base/daemonset.yaml"),
                                  "port: 7701\n            periodSeconds: 10",
                                  "port: 7799\n            periodSeconds: 10"),
     "readinessProbe uses port 7799"),
    ("patch target", lambda d: edit(os.path.join(d, "kubernetes/overlays/tdx/runtime-class-patch.yaml"),
                                    "name: cloisterd", "name: cloisterd-old"),
     "which the render does not contain"),
    ("policy copy", lambda d: edit(os.path.join(d, "kubernetes/overlays/sev-snp/attestation-policy.yaml"),
                                   "max_evidence_age_seconds: 3600", "max_evidence_age_seconds: 7200"),
     "differs from every file in policies/attestation"),
    ("exec", lambda d: edit(os.path.join(d, "systemd/cloisterd.service"),
                            "ExecStart=/usr/bin/cloisterd", "ExecStart=/usr/bin/cloisterdd"),
     "runs cloisterdd, which is unknown"),
    ("bad yaml", lambda d: edit(os.path.join(d, "kubernetes/base/namespace.yaml"),
                                "name: cloister", "name: [cloister"),
     "not valid YAML"),
]


def main():
    deploy = os.path.normpath(os.path.join(HERE, ".."))
    policies = os.path.normpath(os.path.join(HERE, "..", "..", "policies"))
    clean = run_check(deploy, policies)
    if clean.returncode != 0:
        print("the unbroken tree fails:\n" + clean.stdout)
        return 1
    failures = 0
    for name, breakage, expected in BREAKAGES:
        with tempfile.TemporaryDirectory() as scratch:
            copy = os.path.join(scratch, "deploy")
            shutil.copytree(deploy, copy)
            breakage(copy)
            result = run_check(copy, policies)
            if result.returncode == 0 or expected not in result.stdout:
                print(f"{name}: not reported (wanted '{expected}'):\n{result.stdout}")
                failures += 1
            else:
                print(f"{name}: reported")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

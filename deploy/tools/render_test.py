#!/usr/bin/env python3
"""Tests render.py: the Kubernetes render with images and Secrets filled in, the podman
translation (what kube play starts), and a one-line error for each bad argument."""

import os
import subprocess
import sys
import tempfile

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
BASE = os.path.join(HERE, "..", "kubernetes", "base")
failures = []


def render(*args):
    return subprocess.run([sys.executable, os.path.join(HERE, "render.py"), *args],
                          capture_output=True, text=True, timeout=60)


def check(name, condition, detail=""):
    if not condition:
        failures.append(f"{name}: {detail}")


def by_kind(objects, kind):
    return [o for o in objects if o.get("kind") == kind]


with tempfile.TemporaryDirectory() as tmp:
    cert = os.path.join(tmp, "tls.crt")
    key = os.path.join(tmp, "tls.key")
    with open(cert, "w") as f:
        f.write("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    with open(key, "w") as f:
        f.write("-----BEGIN PRIVATE KEY-----\nMIIC\n-----END PRIVATE KEY-----\n")
    secret_args = ["--secret-file", f"cloister-tls/tls.crt={cert}",
                   "--secret-file", f"cloister-tls/tls.key={key}"]

    # The Kubernetes render: every object of the base, the image and the Secret filled in.
    run = render(BASE, "--image", "cloister=localhost/cloister:1.2.3", *secret_args)
    check("kubernetes render exits 0", run.returncode == 0, run.stderr)
    objects = list(yaml.safe_load_all(run.stdout)) if run.returncode == 0 else []
    kinds = sorted({o["kind"] for o in objects})
    check("kubernetes render kinds", kinds == ["ConfigMap", "DaemonSet", "Namespace",
                                               "NetworkPolicy", "Secret", "Service",
                                               "ServiceAccount"], kinds)
    for ds in by_kind(objects, "DaemonSet"):
        image = ds["spec"]["template"]["spec"]["containers"][0]["image"]
        check("image set", image == "localhost/cloister:1.2.3", image)
        check("grpc probes kept", "grpc" in ds["spec"]["template"]["spec"]["containers"][0]["livenessProbe"])
    for secret in by_kind(objects, "Secret"):
        check("secret filled", secret["stringData"]["tls.crt"].startswith("-----BEGIN CERTIFICATE"),
              secret.get("stringData"))
    for cm in by_kind(objects, "ConfigMap"):
        check("config in ConfigMap", "listen:" in cm["data"]["cloisterd.yaml"])
        check("no render bookkeeping", "x-generated-from" not in cm)

    # For podman: a Deployment, exec probes, the Secret carried by a ConfigMap, a host port.
    host_dir = os.path.join(tmp, "secrets")
    run = render(BASE, "--image", "cloister=localhost/cloister:1.2.3", *secret_args,
                 "--for", "podman", "--publish", "tenant=17700", "--secret-host-dir", host_dir)
    check("podman render exits 0", run.returncode == 0, run.stderr)
    objects = list(yaml.safe_load_all(run.stdout)) if run.returncode == 0 else []
    kinds = sorted(o["kind"] for o in objects)
    check("podman render kinds", kinds == ["ConfigMap", "Deployment"], kinds)
    for d in by_kind(objects, "Deployment"):
        spec = d["spec"]["template"]["spec"]
        container = spec["containers"][0]
        check("one replica", d["spec"]["replicas"] == 1)
        check("no node selector", "nodeSelector" not in spec)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            command = container[probe].get("exec", {}).get("command", [])
            check(f"{probe} runs cloister status",
                  command == ["cloister", "status", "--operator", "127.0.0.1:7701"], command)
        tenant = [p for p in container["ports"] if p["name"] == "tenant"][0]
        check("host port", tenant.get("hostPort") == 17700 and tenant.get("hostIP") == "127.0.0.1",
              tenant)
        tls = [v for v in spec["volumes"] if v["name"] == "tls"][0]
        folder = os.path.join(host_dir, "cloister-tls")
        check("tls from a host folder", tls.get("hostPath", {}).get("path") == folder, tls)
        for name, start in (("tls.crt", "-----BEGIN CERTIFICATE"), ("tls.key", "-----BEGIN PRIVATE")):
            path = os.path.join(folder, name)
            check(f"{name} written", os.path.isfile(path) and open(path).read().startswith(start))
            if os.path.isfile(path):
                st = os.stat(path)
                check(f"{name} mode 0440", st.st_mode & 0o777 == 0o440, oct(st.st_mode))
                if os.geteuid() == 0:
                    check(f"{name} owned by the pod's user", (st.st_uid, st.st_gid) == (10001, 10001),
                          (st.st_uid, st.st_gid))
    for expected in ("DaemonSet/cloisterd becomes a Deployment", "left out NetworkPolicy/cloisterd",
                     "Secret/cloister-tls is written as files under --secret-host-dir"):
        check(f"note '{expected}'", expected in run.stderr, run.stderr)

    # Bad arguments: exit 1 and one line that names what was wrong.
    bad = [
        (["--image", "nosuch=img:1"], "no container uses image nosuch"),
        (["--image", "cloister"], "--image wants KEY=VALUE"),
        (["--secret-file", "missing/tls.crt=" + cert], "no Secret named missing"),
        (["--secret-file", "cloister-tls/tls.crt=" + os.path.join(tmp, "absent")], "cannot read"),
        (["--secret-file", "cloister-tls=" + cert], "SECRET/KEY=PATH"),
        (["--for", "podman", "--publish", "tenant=99999"], "from 1 to 65535"),
        (["--for", "podman", "--publish", "nosuch=8080", "--secret-host-dir", os.path.join(tmp, "n1")]
         + secret_args, "no container declares such a port"),
        (["--publish", "tenant=8080"], "--publish is for --for podman"),
        (["--for", "podman"] + secret_args, "give --secret-host-dir DIR"),
        (["--for", "podman", "--secret-host-dir", os.path.join(tmp, "n2")], "tls.crt, tls.key empty"),
        (["--secret-host-dir", os.path.join(tmp, "n3")], "--secret-host-dir is for --for podman"),
    ]
    for args, message in bad:
        run = render(BASE, *args)
        lines = run.stderr.strip().splitlines()
        check(f"{args} fails", run.returncode == 1, run.returncode)
        check(f"{args} says '{message}'", len(lines) == 1 and message in lines[0], run.stderr)
        check(f"{args} prints no YAML", run.stdout == "", run.stdout[:80])
    for n in ("n1", "n2", "n3"):
        check(f"nothing written for bad arguments ({n})", not os.path.exists(os.path.join(tmp, n)))
    run = render(os.path.join(tmp, "nowhere"))
    check("missing kustomization fails", run.returncode == 1 and "no kustomization.yaml" in run.stderr,
          run.stderr)

for line in failures:
    print(line)
print(f"render.py: {'ok' if not failures else f'{len(failures)} failures'}")
sys.exit(1 if failures else 0)

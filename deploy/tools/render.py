#!/usr/bin/env python3
"""Renders a kustomization in deploy/kubernetes to plain YAML, without kubectl.

    render.py deploy/kubernetes/base [--image NAME=REF] [--secret-file SECRET/KEY=PATH]...
              [--for podman [--publish PORT=HOSTPORT]... [--host-ip IP] [--secret-host-dir DIR]]
              [-o FILE]

The render is check_deploy.py's (resources, components, strategic-merge patches, ConfigMap
generators, namespace, images); the rendered objects are checked the same way and any problem
is an error (exit 1, one line per problem). Then:

  --image NAME=REF           sets the image of every container whose image is NAME or was
                             rendered from NAME (the `images:` entry), e.g.
                             cloister=localhost/cloister:0.1.0
  --secret-file S/KEY=PATH   puts PATH's content under KEY of Secret S (so that TLS keys and
                             tokens are filled in at render time and never committed)

--for podman turns the render into what `podman kube play` (4.3, Debian bookworm) starts, and
says on stderr what it changed and why:
  - a DaemonSet becomes a Deployment with one replica (kube play has no DaemonSets);
  - Namespace, ServiceAccount, Service and NetworkPolicy objects are left out (there is no
    cluster: no API server, no cluster DNS, no CNI policy), and so are nodeSelector,
    runtimeClassName, resources and the service account fields;
  - gRPC probes become exec probes that run `cloister status` against the same port
    (kube play runs exec, httpGet and tcpSocket probes only);
  - a Secret volume becomes a hostPath volume on a folder under --secret-host-dir DIR that
    holds the Secret's keys as files, owned by the pod's user and group (runAsUser, fsGroup)
    with the volume's defaultMode: podman 4.3 writes a Secret volume's files base64-encoded
    and world-readable, so a PEM key would arrive unreadable (and cloisterd refuses a key
    file that every user can read);
  - --publish PORT=HOSTPORT publishes the container port named (or numbered) PORT on the host
    (hostPort, on --host-ip, default 127.0.0.1).
"""

import argparse
import base64
import os
import subprocess
import sys

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_deploy  # noqa: E402  (the renderer and its checks)

DROPPED_KINDS = ("Namespace", "ServiceAccount", "Service", "NetworkPolicy")
DROPPED_POD_FIELDS = ("nodeSelector", "runtimeClassName", "serviceAccountName",
                      "automountServiceAccountToken")


def fail(message):
    print(f"render.py: {message}", file=sys.stderr)
    sys.exit(1)


def parse_pair(value, flag):
    key, sep, rest = value.partition("=")
    if not sep or not key or not rest:
        fail(f"{flag} wants KEY=VALUE, not '{value}'")
    return key, rest


def set_images(objects, assignments, image_entries):
    """NAME=REF: every container whose image is NAME, or the newName[:newTag] an `images:`
    entry named NAME produced."""
    for name, ref in assignments:
        produced = {name}
        for entry in image_entries:
            if entry.get("name") == name:
                produced.add(f"{entry.get('newName', name)}:{entry.get('newTag', 'latest')}")
        hits = 0
        for container in check_deploy.containers_of(objects):
            if container.get("image") in produced or container.get("image", "").split(":")[0] == name:
                container["image"] = ref
                hits += 1
        if hits == 0:
            fail(f"--image {name}=...: no container uses image {name}")


def image_entries_of(folder):
    """The `images:` entries of a kustomization and everything it includes."""
    entries = []
    path = check_deploy.kustomization_file(folder)
    if path is None:
        return entries
    with open(path, encoding="utf-8") as f:
        k = yaml.safe_load(f) or {}
    entries += k.get("images", []) or []
    for entry in (k.get("resources", []) or []) + (k.get("components", []) or []):
        target = os.path.join(folder, entry)
        if os.path.isdir(target):
            entries += image_entries_of(target)
    return entries


def fill_secrets(objects, assignments):
    for target, path in assignments:
        secret_name, sep, key = target.partition("/")
        if not sep or not key:
            fail(f"--secret-file wants SECRET/KEY=PATH, not '{target}={path}'")
        secrets = [o for o in objects if o.get("kind") == "Secret"
                   and o.get("metadata", {}).get("name") == secret_name]
        if not secrets:
            fail(f"--secret-file {target}: the render holds no Secret named {secret_name}")
        try:
            with open(path, encoding="utf-8") as f:
                content = f.read()
        except OSError as e:
            fail(f"--secret-file {target}: cannot read {path}: {e.strerror}")
        for secret in secrets:
            secret.setdefault("stringData", {})[key] = content
            (secret.get("data") or {}).pop(key, None)


def secret_content(secret):
    data = {}
    for key, value in (secret.get("data") or {}).items():
        data[key] = base64.b64decode(value).decode("utf-8")
    for key, value in (secret.get("stringData") or {}).items():
        data[key] = value
    return data


def probe_for_podman(probe):
    """A gRPC probe becomes `cloister status --operator 127.0.0.1:PORT`."""
    if "grpc" not in probe:
        return probe, False
    port = probe["grpc"].get("port")
    converted = {k: v for k, v in probe.items() if k != "grpc"}
    converted["exec"] = {"command": ["cloister", "status", "--operator", f"127.0.0.1:{port}"]}
    return converted, True


def write_secret_files(secret, folder, mode, uid, gid):
    """Writes a Secret's keys as files in `folder` (made 0750), mode `mode`, owned by uid:gid
    where given (as root directly, rootless through `podman unshare`). Returns the folder."""
    data = secret_content(secret)
    empty = [key for key, value in data.items() if not value]
    if empty:
        fail(f"Secret {secret['metadata']['name']}: {', '.join(sorted(empty))} empty "
             "(fill it with --secret-file)")
    folder = os.path.abspath(folder)
    os.makedirs(folder, mode=0o750, exist_ok=True)
    paths = [folder]
    for key, value in data.items():
        path = os.path.join(folder, key)
        with open(path, "w", encoding="utf-8") as f:
            f.write(value)
        os.chmod(path, mode)
        paths.append(path)
    if uid is not None:
        owner = f"{uid}:{gid if gid is not None else uid}"
        if os.geteuid() == 0:
            for path in paths:
                os.chown(path, int(uid), int(gid if gid is not None else uid))
        else:
            run = subprocess.run(["podman", "unshare", "chown", owner, *paths],
                                 capture_output=True, text=True)
            if run.returncode != 0:
                fail(f"cannot hand {folder} to {owner}: {run.stderr.strip()}")
    return folder


def for_podman(objects, publish, host_ip, notes, secret_host_dir):
    secrets = {o["metadata"]["name"]: o for o in objects if o.get("kind") == "Secret"}
    declared = set()
    for container in check_deploy.containers_of(objects):
        for port in container.get("ports", []) or []:
            declared |= {port.get("name"), str(port.get("containerPort"))}
    unknown = [p for p in publish if p not in declared]
    if unknown:  # before anything is written
        fail(f"--publish {', '.join(unknown)}: no container declares such a port")
    out = []
    for o in objects:
        kind = o.get("kind")
        name = o.get("metadata", {}).get("name")
        if kind in DROPPED_KINDS:
            notes.append(f"left out {kind}/{name} (no cluster under kube play)")
            continue
        if kind == "Secret":
            notes.append(f"Secret/{name} is written as files under --secret-host-dir "
                         "(podman 4.3 writes Secret volume files base64-encoded and world-readable)")
            continue
        if kind == "DaemonSet":
            notes.append(f"DaemonSet/{name} becomes a Deployment with one replica")
            o = dict(o, kind="Deployment")
            spec = dict(o["spec"])
            spec.pop("updateStrategy", None)
            spec["replicas"] = 1
            o["spec"] = spec
        out.append(o)
        spec = check_deploy.pod_spec(o)
        if spec is None:
            continue
        for field in DROPPED_POD_FIELDS:
            if field in spec:
                notes.append(f"{o['kind']}/{name}: left out spec.{field}")
                spec.pop(field)
        security = spec.get("securityContext", {}) or {}
        for volume in spec.get("volumes", []) or []:
            if "secret" in volume:
                secret_name = volume["secret"]["secretName"]
                if secret_name not in secrets:
                    fail(f"volume {volume['name']} mounts Secret {secret_name}, which is not rendered")
                if not secret_host_dir:
                    fail(f"--for podman: volume {volume['name']} mounts Secret {secret_name}: give "
                         "--secret-host-dir DIR (podman 4.3 cannot mount Secret volumes readably)")
                folder = write_secret_files(
                    secrets[secret_name], os.path.join(secret_host_dir, secret_name),
                    volume["secret"].get("defaultMode", 0o440),
                    security.get("runAsUser"), security.get("fsGroup", security.get("runAsGroup")))
                volume.pop("secret")
                volume["hostPath"] = {"path": folder, "type": "Directory"}
        for container in spec.get("containers", []) or []:
            if container.pop("resources", None) is not None:
                notes.append(f"{o['kind']}/{name}: container {container['name']}: left out resources")
            for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
                if probe_name in container:
                    container[probe_name], changed = probe_for_podman(container[probe_name])
                    if changed:
                        notes.append(f"{o['kind']}/{name}: {probe_name} runs `cloister status` "
                                     "instead of a gRPC health check")
            for port in container.get("ports", []) or []:
                for wanted, host_port in list(publish.items()):
                    if wanted in (port.get("name"), str(port.get("containerPort"))):
                        port["hostPort"] = host_port
                        port["hostIP"] = host_ip
                        publish.pop(wanted)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("kustomization", help="a folder with a kustomization.yaml")
    parser.add_argument("--image", action="append", default=[], metavar="NAME=REF")
    parser.add_argument("--secret-file", action="append", default=[], metavar="SECRET/KEY=PATH")
    parser.add_argument("--for", dest="target", choices=["kubernetes", "podman"],
                        default="kubernetes")
    parser.add_argument("--publish", action="append", default=[], metavar="PORT=HOSTPORT")
    parser.add_argument("--host-ip", default="127.0.0.1")
    parser.add_argument("--secret-host-dir", metavar="DIR",
                        help="--for podman: where the Secrets' files are written")
    parser.add_argument("-o", "--output", help="write here instead of stdout")
    args = parser.parse_args()

    problems = check_deploy.Problems()
    objects = check_deploy.render(args.kustomization, problems)
    if not objects and not problems.lines:
        problems.add(args.kustomization, "renders to nothing")
    check_deploy.check_objects(args.kustomization, objects, problems)
    if problems.lines:
        for line in problems.lines:
            print(line, file=sys.stderr)
        return 1
    for o in objects:
        o.pop("x-generated-from", None)

    set_images(objects, [parse_pair(v, "--image") for v in args.image],
               image_entries_of(args.kustomization))
    fill_secrets(objects, [parse_pair(v, "--secret-file") for v in args.secret_file])
    if args.publish and args.target != "podman":
        fail("--publish is for --for podman (a cluster publishes through Services)")
    if args.secret_host_dir and args.target != "podman":
        fail("--secret-host-dir is for --for podman (a cluster mounts Secrets itself)")
    if args.target == "podman":
        publish = {}
        for value in args.publish:
            port, host_port = parse_pair(value, "--publish")
            if not host_port.isdigit() or not 0 < int(host_port) < 65536:
                fail(f"--publish {value}: the host port must be a number from 1 to 65535")
            publish[port] = int(host_port)
        notes = []
        objects = for_podman(objects, publish, args.host_ip, notes, args.secret_host_dir)
        for note in notes:
            print(f"render.py: podman: {note}", file=sys.stderr)

    text = yaml.safe_dump_all(objects, sort_keys=False, default_flow_style=False)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

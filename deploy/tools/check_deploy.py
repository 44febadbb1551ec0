#!/usr/bin/env python3
"""Checks the deployment recipes in deploy/ without a cluster.

Kubernetes: every kustomization (base, components, overlays) is resolved: each file it names
(resources, components, patches, generator files) must exist and parse as YAML, and each
folder must hold a kustomization. Every overlay is then rendered here (resources, components,
strategic-merge patches on kind+name, ConfigMap generators with create/replace, namespace,
images) and the result is checked: every object has apiVersion, kind and a name; every
container has an image, and its probes use ports it declares; every ConfigMap and Secret a
pod mounts is part of the render; every cloisterd.yaml in a generator passes
`cloisterd --check-config --skip-file-checks` when --cloisterd is given; overlay copies of
attestation policies are identical to a file in policies/attestation. When kubectl is on PATH
(and --no-kubectl is not given), `kubectl kustomize` must render each overlay to the same set
of objects.

systemd: each unit has its sections, and every Exec line runs a program that exists in this
tree (deploy/systemd) or is one of the Cloister binaries or system tools named below.

Exit status 0 when everything holds; 1 with one line per problem otherwise.
"""

import argparse
import copy
import os
import shutil
import subprocess
import sys

import yaml

KUSTOMIZATION_NAMES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
CLOISTER_BINARIES = {"cloisterd", "cloister-enclave", "cloister", "cloister-verify", "cloister-audit"}
SYSTEM_TOOLS = {"kill", "socat"}


class Problems:
    def __init__(self):
        self.lines = []

    def add(self, where, what):
        self.lines.append(f"{where}: {what}")


def load_yaml_documents(path, problems):
    try:
        with open(path, encoding="utf-8") as f:
            return [d for d in yaml.safe_load_all(f) if d is not None]
    except FileNotFoundError:
        problems.add(path, "missing")
    except yaml.YAMLError as e:
        problems.add(path, f"not valid YAML: {e}")
    return []


def kustomization_file(folder):
    for name in KUSTOMIZATION_NAMES:
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            return path
    return None


def generator_file_path(folder, entry):
    """A generator `files:` entry is PATH or KEY=PATH; returns (key, full path)."""
    key, _, path = entry.partition("=") if "=" in entry else (None, None, entry)
    return key or os.path.basename(path), os.path.join(folder, path)


def deep_merge(target, patch):
    """Strategic merge, enough for our patches: maps merge, lists of named maps merge by
    name, other lists and scalars replace."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            deep_merge(target[key], value)
        elif (isinstance(value, list) and isinstance(target.get(key), list)
              and all(isinstance(v, dict) and "name" in v for v in value)
              and all(isinstance(v, dict) and "name" in v for v in target[key])):
            by_name = {item["name"]: item for item in target[key]}
            for item in value:
                if item["name"] in by_name:
                    deep_merge(by_name[item["name"]], item)
                else:
                    target[key].append(copy.deepcopy(item))
        else:
            target[key] = copy.deepcopy(value)


def render(folder, problems, seen=None):
    """Returns the objects a kustomization folder produces (no hash suffixes)."""
    seen = seen or set()
    folder = os.path.normpath(folder)
    if folder in seen:
        problems.add(folder, "kustomization includes itself")
        return []
    seen = seen | {folder}
    path = kustomization_file(folder)
    if path is None:
        problems.add(folder, "no kustomization.yaml")
        return []
    docs = load_yaml_documents(path, problems)
    if len(docs) != 1 or not isinstance(docs[0], dict):
        problems.add(path, "expected one map")
        return []
    k = docs[0]
    known = {"apiVersion", "kind", "namespace", "labels", "resources", "components", "patches",
             "configMapGenerator", "secretGenerator", "images", "namePrefix", "commonLabels"}
    for key in k:
        if key not in known:
            problems.add(path, f"field '{key}' is not handled by this check")
    objects = []
    for entry in k.get("resources", []) or []:
        target = os.path.join(folder, entry)
        if os.path.isdir(target):
            objects += render(target, problems, seen)
        elif os.path.isfile(target):
            objects += [d for d in load_yaml_documents(target, problems) if isinstance(d, dict)]
        else:
            problems.add(path, f"resources: {entry} does not exist")
    patches = []
    for entry in k.get("components", []) or []:
        target = os.path.join(folder, entry)
        component = kustomization_file(target) if os.path.isdir(target) else None
        if component is None:
            problems.add(path, f"components: {entry} is not a folder with a kustomization")
            continue
        comp_docs = load_yaml_documents(component, problems)
        if comp_docs and comp_docs[0].get("kind") != "Component":
            problems.add(component, "kind must be Component")
        objects += render(target, problems, seen) if comp_docs and comp_docs[0].get("resources") else []
        for patch in (comp_docs[0].get("patches", []) if comp_docs else []) or []:
            patches.append((target, patch))
    for patch in k.get("patches", []) or []:
        patches.append((folder, patch))
    for base, patch in patches:
        if "path" not in patch:
            problems.add(path, "patches: only file patches (path:) are handled")
            continue
        patch_path = os.path.join(base, patch["path"])
        for doc in load_yaml_documents(patch_path, problems):
            matches = [o for o in objects if o.get("kind") == doc.get("kind")
                       and o.get("metadata", {}).get("name") == doc.get("metadata", {}).get("name")]
            if not matches:
                problems.add(patch_path, f"patches {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
                                         " which the render does not contain")
            for match in matches:
                deep_merge(match, doc)
    for generator in k.get("configMapGenerator", []) or []:
        data = {}
        for entry in generator.get("files", []) or []:
            key, file_path = generator_file_path(folder, entry)
            if not os.path.isfile(file_path):
                problems.add(path, f"configMapGenerator {generator.get('name')}: {entry} does not exist")
                continue
            if file_path.endswith((".yaml", ".yml")):
                load_yaml_documents(file_path, problems)
            with open(file_path, encoding="utf-8") as f:
                data[key] = f.read()
        behavior = generator.get("behavior", "create")
        existing = [o for o in objects if o.get("kind") == "ConfigMap"
                    and o["metadata"]["name"] == generator["name"]]
        if behavior == "create" and existing:
            problems.add(path, f"configMapGenerator {generator['name']} exists already (use behavior)")
        if behavior in ("replace", "merge") and not existing:
            problems.add(path, f"configMapGenerator {generator['name']}: nothing to {behavior}")
        if behavior == "replace":
            for o in existing:
                objects.remove(o)
            existing = []
        if existing:
            existing[0].setdefault("data", {}).update(data)
        else:
            objects.append({"apiVersion": "v1", "kind": "ConfigMap",
                            "metadata": {"name": generator["name"]}, "data": data,
                            "x-generated-from": [generator_file_path(folder, e)[1]
                                                 for e in generator.get("files", []) or []]})
    if k.get("secretGenerator"):
        problems.add(path, "secretGenerator: keep secrets out of the tree (use a Secret manifest)")
    for image in k.get("images", []) or []:
        for container in containers_of(objects):
            if container.get("image") == image["name"]:
                container["image"] = f"{image.get('newName', image['name'])}:{image.get('newTag', 'latest')}"
    if k.get("namespace"):
        for o in objects:
            if o.get("kind") != "Namespace":
                o.setdefault("metadata", {})["namespace"] = k["namespace"]
    return objects


def pod_spec(obj):
    if obj.get("kind") in ("Deployment", "DaemonSet", "StatefulSet", "Job"):
        return obj.get("spec", {}).get("template", {}).get("spec", {})
    if obj.get("kind") == "Pod":
        return obj.get("spec", {})
    return None


def containers_of(objects):
    for o in objects:
        spec = pod_spec(o)
        if spec:
            yield from spec.get("containers", []) or []


def check_objects(name, objects, problems):
    names = {(o.get("kind"), o.get("metadata", {}).get("name")) for o in objects}
    for o in objects:
        if not o.get("apiVersion") or not o.get("kind") or not o.get("metadata", {}).get("name"):
            problems.add(name, f"object without apiVersion, kind or name: {str(o)[:80]}")
    for o in objects:
        spec = pod_spec(o)
        if spec is None:
            continue
        where = f"{name}: {o['kind']}/{o['metadata']['name']}"
        for container in spec.get("containers", []) or []:
            if not container.get("image"):
                problems.add(where, f"container {container.get('name')} has no image")
            ports = {p.get("containerPort") for p in container.get("ports", []) or []}
            port_names = {p.get("name") for p in container.get("ports", []) or []}
            for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
                probe = container.get(probe_name)
                if probe is None:
                    problems.add(where, f"container {container.get('name')} has no {probe_name}")
                    continue
                for kind in ("grpc", "httpGet", "tcpSocket"):
                    if kind in probe:
                        port = probe[kind].get("port")
                        if port not in ports and port not in port_names:
                            problems.add(where, f"{probe_name} uses port {port}, which the container "
                                                "does not declare")
            mounts = {m.get("name") for m in container.get("volumeMounts", []) or []}
            volumes = {v.get("name") for v in spec.get("volumes", []) or []}
            for mount in mounts - volumes:
                problems.add(where, f"volumeMount {mount} has no volume")
        for volume in spec.get("volumes", []) or []:
            if "configMap" in volume and ("ConfigMap", volume["configMap"]["name"]) not in names:
                problems.add(where, f"volume {volume['name']} mounts ConfigMap "
                                    f"{volume['configMap']['name']}, which is not in the render")
            if "secret" in volume and ("Secret", volume["secret"]["secretName"]) not in names:
                problems.add(where, f"volume {volume['name']} mounts Secret "
                                    f"{volume['secret']['secretName']}, which is not in the render")
        if spec.get("serviceAccountName") and ("ServiceAccount", spec["serviceAccountName"]) not in names:
            problems.add(where, f"ServiceAccount {spec['serviceAccountName']} is not in the render")


def check_cloisterd_configs(objects, cloisterd, problems):
    for o in objects:
        for source in o.get("x-generated-from", []):
            if os.path.basename(source) != "cloisterd.yaml" or not cloisterd:
                continue
            run = subprocess.run([cloisterd, "--check-config", source, "--skip-file-checks"],
                                 capture_output=True, text=True, timeout=60)
            if run.returncode != 0:
                problems.add(source, f"cloisterd --check-config: {run.stderr.strip()}")


def check_policy_copies(kubernetes_dir, policies_dir, problems):
    originals = set()
    for name in os.listdir(os.path.join(policies_dir, "attestation")):
        if name.endswith(".yaml"):
            with open(os.path.join(policies_dir, "attestation", name), encoding="utf-8") as f:
                originals.add(f.read())
    for root, _, files in os.walk(kubernetes_dir):
        for name in files:
            if name == "attestation-policy.yaml":
                with open(os.path.join(root, name), encoding="utf-8") as f:
                    if f.read() not in originals:
                        problems.add(os.path.join(root, name),
                                     "differs from every file in policies/attestation (copy it again)")


def kubectl_render(folder, problems):
    run = subprocess.run(["kubectl", "kustomize", folder], capture_output=True, text=True, timeout=120)
    if run.returncode != 0:
        problems.add(folder, f"kubectl kustomize failed: {run.stderr.strip()}")
        return None
    objects = [d for d in yaml.safe_load_all(run.stdout) if d]
    result = set()
    for o in objects:
        name = o["metadata"]["name"]
        if o["kind"] == "ConfigMap" and "-" in name:
            name = name.rsplit("-", 1)[0]  # the content hash kustomize appends
        result.add((o["kind"], name))
    return result


def check_systemd(systemd_dir, problems):
    for name in sorted(os.listdir(systemd_dir)):
        path = os.path.join(systemd_dir, name)
        if not name.endswith((".service", ".socket")):
            continue
        sections = set()
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                if line.startswith("["):
                    sections.add(line)
                    continue
                if "=" not in line:
                    problems.add(f"{path}:{number}", "neither a section, a comment nor KEY=VALUE")
                    continue
                key, value = line.split("=", 1)
                if key.startswith("Exec") and value:
                    program = os.path.basename(value.split()[0].lstrip("-@+!"))
                    if (program not in CLOISTER_BINARIES and program not in SYSTEM_TOOLS
                            and not os.path.exists(os.path.join(systemd_dir, program))):
                        problems.add(f"{path}:{number}", f"{key} runs {program}, which is unknown")
        expected = "[Service]" if name.endswith(".service") else "[Socket]"
        for section in ("[Unit]", expected):
            if section not in sections:
                problems.add(path, f"no {section} section")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--deploy", required=True, help="the deploy/ folder")
    parser.add_argument("--policies", required=True, help="the policies/ folder")
    parser.add_argument("--cloisterd", help="a cloisterd binary for --check-config")
    parser.add_argument("--no-kubectl", action="store_true")
    args = parser.parse_args()
    problems = Problems()
    kubernetes = os.path.join(args.deploy, "kubernetes")

    targets = [os.path.join(kubernetes, "base")]
    overlays = os.path.join(kubernetes, "overlays")
    targets += [os.path.join(overlays, name) for name in sorted(os.listdir(overlays))]
    use_kubectl = not args.no_kubectl and shutil.which("kubectl") is not None
    for target in targets:
        objects = render(target, problems)
        if not objects:
            problems.add(target, "renders to nothing")
        check_objects(target, objects, problems)
        check_cloisterd_configs(objects, args.cloisterd, problems)
        if use_kubectl:
            expected = kubectl_render(target, problems)
            ours = {(o["kind"], o["metadata"]["name"]) for o in objects}
            if expected is not None and expected != ours:
                problems.add(target, f"kubectl renders {sorted(expected)}, this check {sorted(ours)}")
    check_policy_copies(kubernetes, args.policies, problems)
    check_systemd(os.path.join(args.deploy, "systemd"), problems)

    for line in problems.lines:
        print(line)
    print(f"checked {len(targets)} kustomizations{' (and kubectl kustomize)' if use_kubectl else ''}: "
          f"{'ok' if not problems.lines else f'{len(problems.lines)} problems'}")
    return 1 if problems.lines else 0


if __name__ == "__main__":
    sys.exit(main())

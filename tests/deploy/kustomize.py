"""A tiny Kustomize renderer for the subset deploy/k8s uses, so the overlays build without kubectl.

Supported: `resources` (files and folders holding a kustomization.yaml), `namespace`, `images`
(newName/newTag) and `patches` that are JSON6902 operation lists with a kind/name target. Anything else
in a kustomization is an error, so the manifests cannot drift into features this renderer ignores.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

SUPPORTED_KEYS = {"apiVersion", "kind", "namespace", "resources", "images", "patches"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume", "StorageClass"}


def _pointer(path: str) -> list[str]:
    return [part.replace("~1", "/").replace("~0", "~") for part in path.lstrip("/").split("/")]


def apply_json6902(doc: dict, operations: list[dict]) -> dict:
    """add / replace / remove (RFC 6902) on a copy of `doc`."""
    doc = copy.deepcopy(doc)
    for operation in operations:
        *parents, last = _pointer(operation["path"])
        node: Any = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        op = operation["op"]
        if op not in ("add", "replace", "remove"):
            raise ValueError(f"unsupported JSON6902 op {op!r}")
        if isinstance(node, list):
            index = len(node) if last == "-" else int(last)
            if op == "add":
                node.insert(index, operation["value"])
            elif op == "replace":
                node[index] = operation["value"]
            else:
                del node[index]
        else:
            if op in ("replace", "remove") and last not in node:
                raise KeyError(f"{operation['path']} does not exist (a {op} needs an existing value)")
            if op == "remove":
                del node[last]
            else:
                node[last] = operation["value"]
    return doc


def _set_images(doc: dict, images: list[dict]) -> None:
    spec = doc.get("spec", {})
    pod = spec.get("template", {}).get("spec", {}) if "template" in spec else {}
    for container in [*pod.get("containers", []), *pod.get("initContainers", [])]:
        name, _, tag = container["image"].partition(":")
        for image in images:
            if image["name"] == name:
                container["image"] = f"{image.get('newName', name)}:{image.get('newTag', tag)}"


def build(folder: Path) -> list[dict]:
    """The documents `kubectl kustomize folder` prints (in file order rather than kustomize's kind order)."""
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    unknown = set(kustomization) - SUPPORTED_KEYS
    if unknown:
        raise ValueError(f"{folder}/kustomization.yaml uses {sorted(unknown)}, which this renderer does not support")
    docs: list[dict] = []
    for resource in kustomization.get("resources", []):
        path = (folder / resource).resolve()
        if path.is_dir():
            docs.extend(build(path))
        else:
            docs.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc)
    for patch in kustomization.get("patches", []):
        target = patch["target"]
        operations = yaml.safe_load((folder / patch["path"]).read_text())
        matched = False
        for i, doc in enumerate(docs):
            if doc["kind"] == target["kind"] and doc["metadata"]["name"] == target["name"]:
                docs[i] = apply_json6902(doc, operations)
                matched = True
        if not matched:
            raise ValueError(f"patch {patch['path']} matches no {target['kind']}/{target['name']}")
    for doc in docs:
        _set_images(doc, kustomization.get("images", []))
        if "namespace" in kustomization and doc["kind"] not in CLUSTER_SCOPED:
            doc["metadata"]["namespace"] = kustomization["namespace"]
    return docs


def by_name(docs: list[dict]) -> dict[tuple[str, str], dict]:
    return {(doc["kind"], doc["metadata"]["name"]): doc for doc in docs}

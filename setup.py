"""Maps the service folders onto `trinity.*` import names (see the package roots below)."""

from pathlib import Path

from setuptools import setup

# The folder layout shows the architecture; the import names read as `trinity.<part>`.
PACKAGE_ROOTS = {
    "trinity": "services/common",
    "trinity.buffer": "services/buffer",
    "trinity.explorer": "services/explorer",
    "trinity.trainer": "services/trainer",
    "trinity.gateway": "services/gateway",
    "trinity.algorithms": "algorithms",
    "trinity.sdk": "sdk",
}


def _packages() -> list[str]:
    found = []
    for name, root in PACKAGE_ROOTS.items():
        for init in sorted(Path(root).rglob("__init__.py")):
            rel = init.parent.relative_to(root).parts
            found.append(".".join((name, *rel)))
    return found


setup(packages=_packages(), package_dir=PACKAGE_ROOTS, include_package_data=True)

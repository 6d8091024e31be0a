"""Run by tests/deploy/test_runtime_set.py in a process of its own: import the whole product with
only the image's requirements (requirements.txt) importable.

Every installed distribution outside that set (pytest, playwright, matplotlib, the embedded
servers...) is hidden by a finder at the front of `sys.meta_path`, so an import of one fails as
it would in the image. Prints one line per failure and exits 1 when there is any."""

import importlib
import importlib.metadata
import os
import pkgutil
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ["config", "core", "chat", "knowledge", "routing", "inference_ops", "observability"]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_set() -> set[str]:
    names = set()
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(_norm(re.split(r"[\[=<>~! ]", line, maxsplit=1)[0]))
    return names


def hidden_modules(allowed: set[str]) -> set[str]:
    hidden = set()
    for module, dists in importlib.metadata.packages_distributions().items():
        if not any(_norm(d) in allowed for d in dists):
            hidden.add(module)
    return hidden


class Hide:
    def __init__(self, modules: set[str]):
        self.modules = modules

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.modules:
            raise ModuleNotFoundError(f"No module named {name!r} (not in requirements.txt)")
        return None


def main() -> int:
    allowed = runtime_set()
    hidden = hidden_modules(allowed)
    for name in list(sys.modules):
        if name.partition(".")[0] in hidden:
            del sys.modules[name]
    sys.meta_path.insert(0, Hide(hidden))
    sys.path.insert(0, str(ROOT))
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    import django

    django.setup()
    failures = []
    for package in PRODUCT:
        for info in pkgutil.walk_packages([str(ROOT / package)], prefix=f"{package}."):
            # A migration is read by the migrate command; a __main__ module runs its program.
            if ".migrations." in info.name or info.name.endswith(".__main__"):
                continue
            try:
                importlib.import_module(info.name)
            except Exception as exc:  # noqa: BLE001 - every failure is reported, not the first
                failures.append(f"{info.name}: {type(exc).__name__}: {exc}")
    for line in failures:
        print(line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

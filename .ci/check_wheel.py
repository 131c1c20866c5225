"""Check what `python -m build` made: one sdist and one wheel of the source tree's version.

Usage: python .ci/check_wheel.py DIST_DIR SOURCE_ROOT

The wheel must hold every module of both packages as the source tree has them, both
py.typed markers, the `cugraphrt` console script and the torch.compile backend's entry point,
and nothing else at the top level; the sdist must carry what a packager needs to test and
document a build (tests, docs, examples, the changelog).
"""

from __future__ import annotations

import ast
import configparser
import sys
import tarfile
import zipfile
from pathlib import Path

PACKAGES = {"cugraphrt": "cugraphrt", "cugraphrt_torch": "adapters/cugraphrt_torch"}
ENTRY_POINTS = {"console_scripts": "cugraphrt.cli:main",
                "torch_dynamo_backends": "cugraphrt_torch.compile.dynamo:backend"}
SDIST_FILES = ["CHANGELOG.md", "README.md", "pyproject.toml", "docs/conf.py", "docs/index.md",
               "examples/capture_cupy_kernels.py", "tests/conftest.py"]


def source_version(root: Path) -> str:
    tree = ast.parse((root / "cugraphrt" / "__init__.py").read_text())
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and getattr(node.targets[0], "id", None) == "__version__"):
            return ast.literal_eval(node.value)
    raise SystemExit("cugraphrt/__init__.py sets no literal __version__")


def check_wheel(path: Path, root: Path, version: str) -> list[str]:
    problems = []
    names = set(zipfile.ZipFile(path).namelist())
    info = f"cugraphrt-{version}.dist-info"
    for package, folder in PACKAGES.items():
        wanted = {f"{package}/{p.relative_to(root / folder).as_posix()}"
                  for p in (root / folder).rglob("*") if p.suffix in (".py", ".typed")
                  and "__pycache__" not in p.parts}
        if missing := sorted(wanted - names):
            problems.append(f"the wheel lacks {missing}")
    tops = {n.split("/")[0] for n in names}
    if extra := sorted(tops - set(PACKAGES) - {info}):
        problems.append(f"the wheel holds more than the packages: {extra}")
    with zipfile.ZipFile(path) as wheel:
        entry_points = configparser.ConfigParser(delimiters=("=",))
        entry_points.read_string(wheel.read(f"{info}/entry_points.txt").decode())
        metadata = wheel.read(f"{info}/METADATA").decode()
    for group, target in ENTRY_POINTS.items():
        got = entry_points.get(group, "cugraphrt", fallback=None)
        if got != target:
            problems.append(f"entry point {group}: cugraphrt should be {target} (got {got})")
    if f"\nVersion: {version}\n" not in metadata:
        problems.append(f"the wheel's METADATA is not version {version}")
    return problems


def check_sdist(path: Path, version: str) -> list[str]:
    with tarfile.open(path) as sdist:
        names = set(sdist.getnames())
    prefix = f"cugraphrt-{version}/"
    return [f"the sdist lacks {name}" for name in SDIST_FILES if prefix + name not in names]


def main(dist: Path, root: Path) -> int:
    version = source_version(root)
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        print(f"expected one wheel and one sdist in {dist} (got {wheels + sdists})")
        return 1
    problems = check_wheel(wheels[0], root, version) + check_sdist(sdists[0], version)
    for problem in problems:
        print(f"[ci] wheel check: {problem}")
    if not problems:
        print(f"[ci] {wheels[0].name} and {sdists[0].name}: version {version}, both packages "
              f"with py.typed, console script and dynamo backend entry points")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))

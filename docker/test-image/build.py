"""Build the test runner image's root filesystem with no registry: a tar for `docker import`.

The image holds busybox (its applets as /bin links), the Python interpreter that runs this
script with only the standard-library modules the fake runner imports (and the shared
libraries they need, at the paths they have here), the fake runner as /runner/runner.py,
the production entrypoint as /usr/local/bin/zoomies-entrypoint and, unless --no-docker-client,
this host's docker client (so the entrypoint's daemon wait can be exercised for real).

    python docker/test-image/build.py --out /tmp/rootfs.tar
    docker import --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' \\
        --change 'ENTRYPOINT ["/usr/local/bin/zoomies-entrypoint"]' \\
        --change 'CMD ["python3", "/runner/runner.py"]' /tmp/rootfs.tar zoomies-test/runner:TAG

`--print-tag` prints a tag derived from everything that goes in, so a fixture can skip a
build whose image the engine already has. Standard library only; Linux only.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "runners" / "github" / "fake" / "runner.py"
ENTRYPOINT = ROOT / "docker" / "runner" / "zoomies-entrypoint.sh"
REPOSITORY = "zoomies-test/runner"
PATH = "/usr/local/bin:/usr/bin:/bin"
CHANGES = (
    f"ENV PATH={PATH}",
    "ENV PYTHONDONTWRITEBYTECODE=1",
    'ENTRYPOINT ["/usr/local/bin/zoomies-entrypoint"]',
    'CMD ["python3", "/runner/runner.py"]',
)
# Imported lazily by what the runner uses (socket's host names, text codecs).
EXTRA_MODULES = ("encodings.idna", "encodings.ascii", "encodings.latin_1", "encodings.utf_8")


def _interpreter() -> Path:
    return Path(os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable))


def _docker_client() -> Path | None:
    found = shutil.which("docker")
    return Path(os.path.realpath(found)) if found else None


_LIST_MODULES = """
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("_zoomies_fake_runner", sys.argv[1])
module = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = module
spec.loader.exec_module(module)
for name in sys.argv[2:]:
    __import__(name)
for mod in list(sys.modules.values()):
    path = getattr(mod, "__file__", None)
    if path:
        print(os.path.realpath(path))
"""


def runner_modules() -> list[str]:
    """Standard-library files a fresh interpreter loads to import the fake runner (not run
    it), in an isolated child so this script's own imports do not count."""
    out = subprocess.run(
        [str(_interpreter()), "-I", "-c", _LIST_MODULES, str(RUNNER), *EXTRA_MODULES],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    stdlib = Path(os.path.realpath(sys.base_prefix))
    return sorted(
        {
            line
            for line in out.splitlines()
            if Path(line).is_relative_to(stdlib) and "site-packages" not in line
        }
    )


def shared_libraries(binary: Path) -> list[Path]:
    """What the dynamic loader maps for `binary` (ldd); none for a static one."""
    try:
        out = subprocess.run(
            ["ldd", str(binary)], capture_output=True, text=True, check=False
        ).stdout
    except FileNotFoundError:
        return []
    libs = []
    for line in out.splitlines():
        match = re.search(r"(/\S+) \(0x", line)
        if match:
            libs.append(Path(match.group(1)))
    return libs


class Rootfs:
    """A tar being written, one member at a time, with parent directories made once."""

    def __init__(self, tar: tarfile.TarFile) -> None:
        self.tar = tar
        self.dirs: set[str] = set()

    def _parents(self, name: str) -> None:
        parts = Path(name).parts[:-1]
        for n in range(1, len(parts) + 1):
            directory = "/".join(parts[:n])
            if directory not in self.dirs:
                info = tarfile.TarInfo(directory)
                info.type = tarfile.DIRTYPE
                info.mode = 0o1777 if directory == "tmp" else 0o755
                self.tar.addfile(info)
                self.dirs.add(directory)

    def dir(self, name: str) -> None:
        self._parents(name + "/x")

    def file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        name = name.lstrip("/")
        self._parents(name)
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = mode
        self.tar.addfile(info, io.BytesIO(data))

    def copy(self, source: Path, name: str | None = None, mode: int | None = None) -> None:
        real = Path(os.path.realpath(source))
        mode = real.stat().st_mode & 0o777 if mode is None else mode
        self.file(name or str(source), real.read_bytes(), mode)

    def link(self, name: str, target: str) -> None:
        name = name.lstrip("/")
        self._parents(name)
        info = tarfile.TarInfo(name)
        info.type = tarfile.SYMTYPE
        info.linkname = target
        self.tar.addfile(info)


def inputs(docker_client: bool) -> list[Path]:
    paths = [Path(__file__), RUNNER, ENTRYPOINT, _interpreter()]
    client = _docker_client() if docker_client else None
    if client is not None:
        paths.append(client)
    return paths


def tag(docker_client: bool = True) -> str:
    digest = hashlib.sha256()
    for path in inputs(docker_client):
        digest.update(str(path).encode())
        digest.update(path.read_bytes())
    digest.update(repr(CHANGES).encode())
    return f"{REPOSITORY}:{digest.hexdigest()[:16]}"


def build(out: Path, docker_client: bool = True) -> None:
    busybox = shutil.which("busybox")
    if busybox is None:
        raise SystemExit("busybox is not installed (apt-get install busybox-static)")
    python = _interpreter()
    copied: set[str] = set()
    with tarfile.open(out, "w") as tar:
        fs = Rootfs(tar)
        for directory in ("bin", "usr/bin", "usr/local/bin", "etc", "root", "runner", "proc"):
            fs.dir(directory)
        fs.dir("tmp")  # 1777, as _parents makes it
        fs.copy(Path(busybox), "/bin/busybox")
        applets = subprocess.run(
            [busybox, "--list"], capture_output=True, text=True, check=True
        ).stdout.split()
        for applet in applets:
            if applet != "busybox":
                fs.link(f"/bin/{applet}", "busybox")
        fs.file("/etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n")
        fs.file("/etc/group", b"root:x:0:\n")
        binaries = [python]
        fs.copy(python)
        fs.link("/usr/bin/python3", str(python))
        for module in runner_modules():
            path = Path(module)
            fs.copy(path)
            copied.add(module)
            if path.suffix == ".so":
                binaries.append(path)
        client = _docker_client() if docker_client else None
        if client is not None:
            fs.copy(client, "/usr/bin/docker")
            binaries.append(client)
        for binary in binaries:
            for lib in shared_libraries(binary):
                if str(lib) not in copied:
                    fs.copy(lib)
                    copied.add(str(lib))
                    # The loader is found by the path written into the binary.
        fs.copy(RUNNER, "/runner/runner.py")
        # Executable whatever the checkout's modes (a zip or a umask can drop them).
        fs.copy(ENTRYPOINT, "/usr/local/bin/zoomies-entrypoint", 0o755)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="where to write the rootfs tar")
    parser.add_argument("--no-docker-client", action="store_true")
    parser.add_argument("--print-tag", action="store_true", help="print the image tag")
    parser.add_argument("--print-changes", action="store_true", help="one --change a line")
    options = parser.parse_args(argv)
    with_client = not options.no_docker_client
    if options.print_tag:
        print(tag(with_client))
    if options.print_changes:
        print("\n".join(CHANGES))
    if options.out:
        build(options.out, with_client)
    return 0


if __name__ == "__main__":
    sys.exit(main())

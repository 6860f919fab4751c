"""The wheel of ``make wheel`` carries its libjpeg-turbo: installed into a fresh virtual environment,
it decodes regions in a mount namespace where the system's libjpeg and its headers are hidden
behind empty files, pixel for pixel as the source build does."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import numpy as np
import pytest

from stoker.decode import per_image
from stoker.version import __version__

ROOT = Path(__file__).resolve().parent.parent
WHEELS = sorted((ROOT / "dist").glob(f"stoker-{__version__}-cp{sys.version_info.major}{sys.version_info.minor}-*.whl"))
REGION = {"top": 37, "left": 51, "height": 201, "width": 250, "scale_denom": 2}
LIBRARY_DIRS = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib")
HEADERS = ("jpeglib.h", "jconfig.h", "jmorecfg.h", "jerror.h")

# Run by the fresh environment's Python inside the namespace: the hidden libraries must not load,
# the source build's extension neither, and the wheel's must, from the wheel's own libjpeg.
IN_NAMESPACE = """
import ctypes, importlib.util, json, sys
from pathlib import Path

region, photo, source_build, out_path, hidden = json.loads(sys.argv[1])
for library in hidden:
    try:
        ctypes.CDLL(library)
        sys.exit(f"{library} still loads")
    except OSError:
        pass
try:
    importlib.util.module_from_spec(importlib.util.spec_from_file_location("_jpeg_region", source_build))
    sys.exit("the source build's extension still loads without the system's libjpeg")
except ImportError:
    pass
from stoker.env import report
from stoker.decode import _jpeg_region
from stoker.decode.per_image import decode_region

out = bytearray(4 << 20)
rows, cols, dy, dx = decode_region(Path(photo).read_bytes(), **region, out=out)
Path(out_path).write_bytes(out[: rows * cols * 3])
maps = [line.split()[-1] for line in open("/proc/self/maps") if "libjpeg" in line]
print(json.dumps({"file": _jpeg_region.__file__, "block": [rows, cols, dy, dx], "maps": sorted(set(maps)),
                  "env": report()}))
"""


def _hidden_files() -> list[str]:
    """The system's libjpeg.so* and jpeg headers, as the files their links lead to."""
    found = {str(p.resolve()) for d in LIBRARY_DIRS if Path(d).is_dir() for p in Path(d).rglob("libjpeg.so*")}
    for include in ("/usr/include", "/usr/local/include"):
        found |= {str(p.resolve()) for name in HEADERS for p in Path(include).rglob(name)}
    return sorted(path for path in found if Path(path).is_file())


def _namespace_refusal(tmp_path: Path) -> str | None:
    """Why an empty file cannot be mounted over another in a new mount namespace here, or None."""
    if shutil.which("unshare") is None:
        return "no unshare command"
    if os.geteuid() != 0:
        return "mounting in a mount namespace needs root (unshare -m)"
    (tmp_path / "a").touch()
    (tmp_path / "b").touch()
    probe = subprocess.run(["unshare", "-m", "mount", "--bind", str(tmp_path / "a"), str(tmp_path / "b")],
                           capture_output=True, text=True)
    return f"unshare -m / mount --bind not allowed here: {probe.stderr.strip()}" if probe.returncode else None


@pytest.mark.skipif(not WHEELS, reason="no wheel in dist/ for this Python: `make wheel` builds it (`make test` does)")
@pytest.mark.skipif(per_image.decode_region is None, reason="C extension not built (no libjpeg headers?)")
def test_the_wheel_decodes_regions_without_the_systems_libjpeg(photos, tmp_path):
    refusal = _namespace_refusal(tmp_path)
    if refusal:
        pytest.skip(refusal)
    [wheel] = WHEELS
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("stoker.libs/libjpeg") for n in names), "no libjpeg grafted into the wheel"
    assert any("/licenses/libjpeg-turbo/" in n for n in names), "libjpeg-turbo's licence is not in the wheel"
    assert any("/licenses/xxhash/" in n for n in names), "xxHash's licence is not in the wheel (decode_chunk has its code)"
    for extension in ("decode/_resample", "augment/_photometric"):
        assert f"stoker/{extension}.pyi" in names and any(
            n.startswith(f"stoker/{extension}.") and n.endswith(".so") for n in names), f"no {extension} extension"

    # A fresh environment with only the wheel installed, reusing this environment's packages (torch ...)
    # through a .pth line: the stoker it imports is the wheel's, not this checkout.
    env = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    python = env / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "project-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                    "--no-index", str(wheel)], check=True)

    photo = next(p for p in sorted(photos.rglob("*.jpg")))
    expected = bytearray(4 << 20)
    rows, cols, dy, dx = per_image.decode_region(photo.read_bytes(), **REGION, out=expected)
    hidden = _hidden_files()
    assert any("libjpeg.so" in path for path in hidden) and any(path.endswith("jpeglib.h") for path in hidden)
    empty = tmp_path / "empty"
    empty.touch()
    source_build = sys.modules["stoker.decode._jpeg_region"].__file__
    arguments = json.dumps([REGION, str(photo), source_build, str(tmp_path / "block"), hidden])
    script = 'for f in "$@"; do mount --bind "$0" "$f"; done; exec "$PYTHON" -I -c "$CODE" "$ARGUMENTS"'
    run = subprocess.run(["unshare", "-m", "sh", "-c", script, str(empty), *hidden], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120,
                         env={**os.environ, "PYTHON": str(python), "CODE": IN_NAMESPACE, "ARGUMENTS": arguments})
    assert run.returncode == 0, run.stderr + run.stdout
    out = json.loads(run.stdout)
    assert Path(out["file"]).is_relative_to(site)  # the wheel's extension, not this checkout's
    assert [m for m in out["maps"] if "stoker.libs" in m], out["maps"]  # its own libjpeg
    assert out["block"] == [rows, cols, dy, dx]
    np.testing.assert_array_equal(np.frombuffer((tmp_path / "block").read_bytes(), np.uint8),
                                  np.frombuffer(expected, np.uint8, rows * cols * 3))
    region_line = next(line for line in out["env"].splitlines() if "region decode" in line)
    assert region_line.split()[2] == "yes", out["env"]
    resize_line = next(line for line in out["env"].splitlines() if "exact resize" in line)
    assert resize_line.split()[2] == "yes", out["env"]

"""A PEP 517 backend for this one package: it writes the wheel itself, so
`pip install integrations/ray` and `pip wheel` work offline (no setuptools fetched)."""

import base64
import hashlib
import os
import zipfile

NAME = "gpulayer_ray"
DIST = "gpulayer_ray"
VERSION = "0.1.0"
HERE = os.path.dirname(os.path.abspath(__file__))
METADATA = f"""Metadata-Version: 2.1
Name: gpulayer-ray
Version: {VERSION}
Summary: Ray runtime_env plugin: Ray's workers run in environments gpulayer builds once per node and caches
Requires-Python: >=3.9
"""
WHEEL = "Wheel-Version: 1.0\nGenerator: gpulayer_ray _build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


def _record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def _files():
    src = os.path.join(HERE, NAME)
    for name in sorted(os.listdir(src)):
        if name.endswith(".py"):
            with open(os.path.join(src, name), "rb") as f:
                yield f"{NAME}/{name}", f.read()


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    filename = f"{DIST}-{VERSION}-py3-none-any.whl"
    info = f"{DIST}-{VERSION}.dist-info"
    entries = list(_files()) + [(f"{info}/METADATA", METADATA.encode()), (f"{info}/WHEEL", WHEEL.encode())]
    record = [_record_line(p, d) for p, d in entries] + [f"{info}/RECORD,,"]
    # A fixed date on every entry: the same sources give the same wheel, byte for byte (a release asset's digest).
    def entry(path):
        return zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0))

    with zipfile.ZipFile(os.path.join(wheel_directory, filename), "w", zipfile.ZIP_DEFLATED) as whl:
        for path, data in entries:
            whl.writestr(entry(path), data, zipfile.ZIP_DEFLATED)
        whl.writestr(entry(f"{info}/RECORD"), "\n".join(record) + "\n", zipfile.ZIP_DEFLATED)
    return filename


def build_sdist(sdist_directory, config_settings=None):
    import tarfile

    base = f"{DIST}-{VERSION}"
    filename = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, filename), "w:gz") as tar:
        for name in ("pyproject.toml", "_build.py", "README.md", NAME):
            if os.path.exists(os.path.join(HERE, name)):
                tar.add(os.path.join(HERE, name), arcname=f"{base}/{name}",
                        filter=lambda t: None if "__pycache__" in t.name else t)
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        data = METADATA.encode()
        info.size = len(data)
        import io
        tar.addfile(info, io.BytesIO(data))
    return filename

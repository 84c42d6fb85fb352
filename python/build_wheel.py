"""Writes memwall's wheel (PEP 427) from the package's built files:

    build_wheel.py --out=memwall-0.1.0-cp311-cp311-linux_x86_64.whl FILE...

Each FILE is a path ending in python/memwall/...; it goes into the archive as
memwall/... . The name, version and tag come from --out's name (the version
must be memwall/__init__.py's __version__); METADATA,
WHEEL and RECORD (sha256 and size of every file) are written here. The
archive is reproducible: sorted entries, fixed timestamps.
"""
import argparse
import base64
import hashlib
import os
import re
import sys
import zipfile

EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can hold


def archive_name(path):
    marker = "python/memwall/"
    at = path.rfind(marker)
    if at < 0:
        sys.exit(f"build_wheel: {path} is not under python/memwall/")
    return path[at + len("python/"):]


def digest(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()

    m = re.fullmatch(r"(memwall)-([^-]+)-((cp\d+)-(cp\d+)-([^-]+))\.whl", os.path.basename(args.out))
    if not m:
        sys.exit(f"build_wheel: {args.out} is not named memwall-VERSION-cpXY-cpXY-PLATFORM.whl")
    name, version, tag, python_tag = m.group(1), m.group(2), m.group(3), m.group(4)
    minor = f"{python_tag[2]}.{python_tag[3:]}"
    dist_info = f"{name}-{version}.dist-info"

    files = {}
    for path in args.files:
        with open(path, "rb") as f:
            files[archive_name(path)] = (f.read(), os.access(path, os.X_OK) and path.endswith(".so"))
    init = files.get("memwall/__init__.py", (b"", False))[0].decode()
    declared = re.search(r'^__version__ = "([^"]+)"$', init, re.M)
    if not declared or declared.group(1) != version:
        sys.exit(f"build_wheel: memwall/__init__.py says __version__ = "
                 f"{declared.group(1) if declared else 'nothing'}, the wheel's name says {version}")
    files[f"{dist_info}/METADATA"] = ("\n".join([
        "Metadata-Version: 2.1",
        f"Name: {name}",
        f"Version: {version}",
        "Summary: ZeRO, ZeRO-Offload and ZeRO-Infinity in C++: estimator, trainer, CPU Adam, checkpoints",
        f"Requires-Python: =={minor}.*",
        "Requires-Dist: numpy",
        "",
        "The Python package of memwall, built with `./bazelw build //python:wheel`; see python/README.md.",
        "",
    ]).encode(), False)
    files[f"{dist_info}/WHEEL"] = ("\n".join([
        "Wheel-Version: 1.0",
        "Generator: memwall python/build_wheel.py",
        "Root-Is-Purelib: false",
        f"Tag: {tag}",
        "",
    ]).encode(), False)
    files[f"{dist_info}/top_level.txt"] = (b"memwall\n", False)
    record = "".join(f"{n},{digest(d)},{len(d)}\n" for n, (d, _) in sorted(files.items()))
    files[f"{dist_info}/RECORD"] = ((record + f"{dist_info}/RECORD,,\n").encode(), False)

    # RECORD last, as PEP 427 recommends; the package before its dist-info.
    order = sorted(files, key=lambda n: (n.startswith(dist_info), n.endswith("/RECORD"), n))
    with zipfile.ZipFile(args.out, "w", zipfile.ZIP_DEFLATED) as z:
        for n in order:
            data, executable = files[n]
            info = zipfile.ZipInfo(n, EPOCH)
            info.external_attr = (0o755 if executable else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)


if __name__ == "__main__":
    main()

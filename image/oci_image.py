#!/usr/bin/env python3
"""Package loopguard.wasm as a reproducible OCI image (OCI image layout on disk).

    python3 image/oci_image.py [--wasm PATH] [--out DIR] [--tag TAG] [--source URL]

writes DIR (default target/image/) as an OCI image layout: `oci-layout`,
`index.json` (one manifest, `org.opencontainers.image.ref.name: TAG`, TAG
defaulting to the crate version from Cargo.toml) and `blobs/sha256/...`. The
manifest digest (`sha256:<hex>`) is printed as the last line of stdout and
written to DIR/digest. Push the layout with any OCI tool, e.g.

    skopeo copy oci:target/image:0.1.0 docker://REGISTRY/loopguard:0.1.0

(`make image` and `make push` do exactly this.)

Shape: the Wasm image "compat" variant
--------------------------------------
The image is an ordinary OCI image: an image manifest
(`application/vnd.oci.image.manifest.v1+json`, schemaVersion 2), an image
config (`application/vnd.oci.image.config.v1+json`, architecture `wasm`, os
`wasip1`, rootfs diff_ids) and exactly one layer
`application/vnd.oci.image.layer.v1.tar+gzip` whose tar holds one regular file,
`plugin.wasm`, the module byte for byte.

Why this shape and not the two-layer "oci" Wasm artifact: the image fetchers
of both Istio's agent (pkg/wasm/imagefetcher.go) and Envoy Gateway
(internal/wasm/imagefetcher.go, the same logic) accept

  * a Docker image whose last layer is a docker tar.gzip holding a file whose
    base name is `plugin.wasm`,
  * an OCI image whose LAST layer is `application/vnd.oci.image.layer.v1.tar+gzip`
    holding a file whose base name is `plugin.wasm` (the compat variant), or
  * an OCI artifact with exactly 2 layers, one of them of media type
    `application/vnd.module.wasm.content.layer.v1+wasm` (the oci variant).

The compat variant is taken by both, and unlike the artifact it is a plain OCI
image that every registry, pull-through mirror, replication job and scanner
handles without knowing any custom media type. In a WasmPlugin (Istio) or an
Envoy Gateway Wasm `Image` source, `sha256` is compared with the MANIFEST
digest (without the `sha256:` prefix), which is what this script prints.

Reproducibility
---------------
Same module bytes + same commit (+ same tag and source) give the same
manifest digest, on any machine:

  * every time stamp is the commit time of HEAD (`git log -1 --format=%ct`),
    or SOURCE_DATE_EPOCH when that is set;
  * the tar is USTAR with fixed fields (mode 0644, uid/gid 0, empty
    uname/gname, mtime = commit time, no device numbers);
  * the gzip stream is written here, not by the gzip module (whose header
    bytes differ between Python versions): no file name, mtime 0, OS byte 255
    ("unknown"), deflate level 9 from zlib;
  * all JSON is serialised with sorted keys and no spaces.

Manifest annotations: org.opencontainers.image.{source,version,revision,
created,title,description} and `module.wasm.image/variant: compat`. The
revision is `git rev-parse HEAD`, with `-dirty` appended when tracked files
differ from HEAD (so a dirty build never passes for the commit).

Standard library only (Python 3.11+: tomllib).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import tomllib
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_WASM = ROOT / "target" / "wasm32-wasip1" / "release" / "loopguard.wasm"
DEFAULT_OUT = ROOT / "target" / "image"

WASM_MAGIC = b"\0asm"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
PLUGIN_FILE = "plugin.wasm"
TITLE = "loopguard"
DESCRIPTION = (
    "Envoy HTTP filter (proxy-wasm) that stops runaway AI-agent request loops "
    "at the gateway"
)


class ImageError(Exception):
    pass


def canonical_json(value) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def git(*args: str) -> str:
    try:
        r = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        detail = getattr(e, "stderr", "") or str(e)
        raise ImageError(f"git {' '.join(args)} failed: {detail.strip()}") from e
    return r.stdout.strip()


def commit_time() -> int:
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch:
        return int(epoch)
    return int(git("log", "-1", "--format=%ct", "HEAD"))


def revision() -> str:
    rev = git("rev-parse", "HEAD")
    if git("status", "--porcelain", "--untracked-files=no"):
        rev += "-dirty"
    return rev


def crate_version() -> str:
    with open(ROOT / "Cargo.toml", "rb") as f:
        return tomllib.load(f)["workspace"]["package"]["version"]


def default_source() -> str | None:
    """The origin remote, if it is an https URL (without credentials)."""
    try:
        url = git("remote", "get-url", "origin")
    except ImageError:
        return None
    if not url.startswith("https://") or "@" in url.split("/")[2]:
        return None
    return url.removesuffix(".git")


def rfc3339(epoch: int) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def layer_tar(module: bytes, mtime: int) -> bytes:
    """A USTAR archive with the single regular file plugin.wasm, fixed fields."""
    info = tarfile.TarInfo(PLUGIN_FILE)
    info.type = tarfile.REGTYPE
    info.size = len(module)
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = mtime
    info.devmajor = info.devminor = 0
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        tar.addfile(info, io.BytesIO(module))
    return buf.getvalue()


def gzip_fixed(data: bytes) -> bytes:
    """RFC 1952 gzip with a fixed header: no name, mtime 0, XFL 2 (best
    compression), OS 255; deflate level 9."""
    header = b"\x1f\x8b\x08\x00" + struct.pack("<I", 0) + b"\x02\xff"
    c = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS, 8, zlib.Z_DEFAULT_STRATEGY)
    body = c.compress(data) + c.flush()
    trailer = struct.pack("<II", zlib.crc32(data) & 0xFFFFFFFF, len(data) & 0xFFFFFFFF)
    return header + body + trailer


def build(module: bytes, *, tag: str, version: str, rev: str, created: int, source: str | None) -> dict:
    """The blobs of the image: {digest: bytes}, plus the manifest digest and
    the index.json bytes."""
    if not module.startswith(WASM_MAGIC):
        raise ImageError("input is not a WebAssembly module (no \\0asm magic)")
    tar = layer_tar(module, created)
    layer = gzip_fixed(tar)
    config = canonical_json(
        {
            "architecture": "wasm",
            "os": "wasip1",
            "created": rfc3339(created),
            "config": {},
            "rootfs": {"type": "layers", "diff_ids": [sha256(tar)]},
        }
    )
    annotations = {
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.revision": rev,
        "org.opencontainers.image.created": rfc3339(created),
        "org.opencontainers.image.title": TITLE,
        "org.opencontainers.image.description": DESCRIPTION,
        "module.wasm.image/variant": "compat",
    }
    if source:
        annotations["org.opencontainers.image.source"] = source
    manifest = canonical_json(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": {"mediaType": CONFIG_TYPE, "digest": sha256(config), "size": len(config)},
            "layers": [{"mediaType": LAYER_TYPE, "digest": sha256(layer), "size": len(layer)}],
            "annotations": annotations,
        }
    )
    digest = sha256(manifest)
    index = canonical_json(
        {
            "schemaVersion": 2,
            "mediaType": INDEX_TYPE,
            "manifests": [
                {
                    "mediaType": MANIFEST_TYPE,
                    "digest": digest,
                    "size": len(manifest),
                    "annotations": {"org.opencontainers.image.ref.name": tag},
                }
            ],
        }
    )
    blobs = {sha256(b): b for b in (layer, config, manifest)}
    return {"digest": digest, "blobs": blobs, "index": index}


def write_layout(out: Path, image: dict) -> None:
    """Write the layout afresh (stale blobs of an earlier build are removed).
    Refuses to clear a non-empty directory that is not an OCI layout."""
    if out.exists():
        if any(out.iterdir()) and not (out / "oci-layout").is_file():
            raise ImageError(f"{out} exists and is not an OCI image layout; not overwriting it")
        shutil.rmtree(out)
    blobdir = out / "blobs" / "sha256"
    blobdir.mkdir(parents=True)
    for digest, data in sorted(image["blobs"].items()):
        (blobdir / digest.removeprefix("sha256:")).write_bytes(data)
    (out / "oci-layout").write_bytes(canonical_json({"imageLayoutVersion": "1.0.0"}))
    (out / "index.json").write_bytes(image["index"])
    (out / "digest").write_text(image["digest"] + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--wasm", type=Path, default=DEFAULT_WASM, help="the module (default: the release build)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="OCI layout directory (default: target/image)")
    p.add_argument("--tag", help="ref name in index.json (default: the crate version)")
    p.add_argument(
        "--source",
        help="org.opencontainers.image.source (default: the origin remote if it is https; '' omits it)",
    )
    args = p.parse_args(argv)
    try:
        module = args.wasm.read_bytes()
    except OSError as e:
        print(f"oci_image: cannot read the module: {e}", file=sys.stderr)
        return 1
    try:
        version = crate_version()
        source = default_source() if args.source is None else (args.source or None)
        image = build(
            module,
            tag=args.tag or version,
            version=version,
            rev=revision(),
            created=commit_time(),
            source=source,
        )
        write_layout(args.out, image)
    except ImageError as e:
        print(f"oci_image: {e}", file=sys.stderr)
        return 1
    print(f"OCI image layout: {args.out} (tag {args.tag or version}, {len(module)} byte module)")
    print(image["digest"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

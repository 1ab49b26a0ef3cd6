"""The OCI image of the module (image/oci_image.py, `make image`, `make push`)
in a round trip through a real registry.

The image is built from the module the other tests load, pushed with skopeo
to Debian's docker-registry (the CNCF distribution registry) on a free
loopback port, and read back with independent clients: the ORAS Python SDK,
the registry HTTP API itself, and skopeo into a second OCI layout. A small
re-implementation of Istio's (and Envoy Gateway's) image fetcher decision
checks that it takes the image by the "compat" path and yields the module.

Every process started here listens on 127.0.0.1 only and is stopped by PID;
every directory is a temporary one, removed afterwards.
"""

from __future__ import annotations

import datetime
import gzip
import hashlib
import io
import json
import os
import posixpath
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from pathlib import Path

import httpx
import oras.client
import oras.schemas
import pytest
import yaml

from harness import ROOT, WASM, free_port, stop_process, wait_for

SCRIPT = ROOT / "image" / "oci_image.py"
SOURCE = "https://github.com/loopguard/loopguard"  # the Makefile's IMAGE_SOURCE
VERSION = tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["package"]["version"]

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"
WASM_LAYER = "application/vnd.module.wasm.content.layer.v1+wasm"


def need(tool: str) -> str:
    path = shutil.which(tool)
    if not path:
        pytest.fail(f"`{tool}` is not installed: run the tests through `make test`, which installs it", pytrace=False)
    return path


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def commit_time() -> int:
    return int(os.environ.get("SOURCE_DATE_EPOCH") or git("log", "-1", "--format=%ct", "HEAD"))


def build_image(out: Path, wasm: str = WASM, tag: str = VERSION) -> tuple[str, subprocess.CompletedProcess]:
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--wasm", wasm, "--out", str(out), "--tag", tag, "--source", SOURCE],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, f"oci_image.py failed:\n{r.stdout}\n{r.stderr}"
    return r.stdout.strip().splitlines()[-1], r


def layout_blob(layout: Path, digest: str) -> bytes:
    return (layout / "blobs" / "sha256" / digest.removeprefix("sha256:")).read_bytes()


def skopeo(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    r = subprocess.run([need("skopeo"), *args], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"skopeo {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}"
    return r


# --- Istio's / Envoy Gateway's image fetcher decision --------------------------


class Rejected(Exception):
    pass


def _plugin_from_tar_gzip(blob: bytes) -> bytes:
    """The first entry whose base name is plugin.wasm, as extractWasmPluginBinary."""
    try:
        data = gzip.decompress(blob)
    except OSError as e:
        raise Rejected(f"failed to parse layer as tar.gz: {e}") from e
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for member in tar:
            if posixpath.basename(member.name) == "plugin.wasm":
                f = tar.extractfile(member)
                return f.read() if f else b""
    raise Rejected("plugin.wasm not found in the archive")


def _last_tar_gzip(layers: list[dict], media_type: str, fetch) -> bytes:
    if not layers:
        raise Rejected("number of layers must be greater than zero")
    layer = layers[-1]
    if layer["mediaType"] != media_type:
        raise Rejected(f"invalid media type {layer['mediaType']} (expect {media_type})")
    return _plugin_from_tar_gzip(fetch(layer))


def istio_extract(manifest: dict, fetch) -> tuple[str, bytes]:
    """Mirror of PrepareFetch's binaryFetcher in Istio's pkg/wasm/imagefetcher.go
    (Envoy Gateway's internal/wasm/imagefetcher.go is the same): a Docker
    schema 2 manifest must have a docker tar.gzip last layer; anything else is
    tried as the compat variant (last layer OCI tar+gzip holding plugin.wasm),
    then as the oci variant (exactly 2 layers, one of the Wasm content type).
    Returns (variant, module bytes); raises Rejected."""
    layers = manifest.get("layers") or []
    if manifest.get("mediaType") == DOCKER_MANIFEST:
        return "docker", _last_tar_gzip(layers, DOCKER_LAYER, fetch)
    try:
        return "compat", _last_tar_gzip(layers, OCI_LAYER, fetch)
    except Rejected as e:
        compat_error = e
    if len(layers) != 2:
        raise Rejected(f"not compat ({compat_error}); not oci: number of layers must be 2 but got {len(layers)}")
    for layer in layers:
        if layer["mediaType"] == WASM_LAYER:
            return "oci", fetch(layer)
    raise Rejected(f"not compat ({compat_error}); not oci: no layer of type {WASM_LAYER}")


# --- fixtures -----------------------------------------------------------------


@pytest.fixture(scope="module")
def tmp():
    d = Path(tempfile.mkdtemp(prefix="loopguard-image-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def image(tmp):
    """The image built from the tests' module: {dir, digest, manifest, stdout}."""
    out = tmp / "layout"
    digest, r = build_image(out)
    manifest = json.loads(layout_blob(out, digest))
    return {"dir": out, "digest": digest, "manifest": manifest, "stdout": r.stdout}


class Registry:
    """Debian's docker-registry on a free loopback port, in a temp dir."""

    def __init__(self) -> None:
        self.binary = need("docker-registry")
        self.dir = Path(tempfile.mkdtemp(prefix="loopguard-registry-"))
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.host}"
        self.proc: subprocess.Popen | None = None
        config = {
            "version": 0.1,
            "log": {"level": "info"},
            "storage": {"filesystem": {"rootdirectory": str(self.dir / "storage")}},
            "http": {"addr": self.host},
        }
        (self.dir / "config.yml").write_text(yaml.safe_dump(config))

    def start(self, timeout: float = 20.0) -> "Registry":
        # REGISTRY_* variables would override the configuration file.
        env = {k: v for k, v in os.environ.items() if not k.startswith("REGISTRY_")}
        self._log = open(self.dir / "registry.log", "wb")
        self.proc = subprocess.Popen(
            [self.binary, "serve", str(self.dir / "config.yml")],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.dir,
            env=env,
        )

        def answers() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"docker-registry exited with {self.proc.returncode}:\n{self.log()}")
            try:
                return httpx.get(f"{self.url}/v2/", timeout=1.0).status_code == 200
            except httpx.HTTPError:
                return False

        if wait_for(answers, timeout):
            return self
        self.stop()
        raise RuntimeError(f"docker-registry did not answer on {self.url}/v2/:\n{self.log()}")

    def log(self) -> str:
        try:
            return (self.dir / "registry.log").read_text(errors="replace")
        except OSError:
            return ""

    def manifest(self, repo: str, ref: str) -> httpx.Response:
        return httpx.get(
            f"{self.url}/v2/{repo}/manifests/{ref}", headers={"Accept": MANIFEST_TYPE}, timeout=10
        )

    def stop(self) -> None:
        stop_process(self.proc)
        if getattr(self, "_log", None):
            self._log.close()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def registry():
    r = Registry()
    try:
        yield r.start()
    except BaseException:
        print(f"\n--- docker-registry log ---\n{r.log()[-20000:]}", file=sys.stderr)
        raise
    finally:
        r.cleanup()


@pytest.fixture(scope="module")
def pushed(image, registry, tmp):
    """The image pushed to the registry as loopguard:VERSION; the digest skopeo reports."""
    digest_file = tmp / "pushed-digest"
    skopeo(
        "copy",
        "--dest-tls-verify=false",
        "--digestfile",
        str(digest_file),
        f"oci:{image['dir']}:{VERSION}",
        f"docker://{registry.host}/loopguard:{VERSION}",
    )
    return digest_file.read_text().strip()


@pytest.fixture(scope="module")
def oras_client(registry):
    return oras.client.OrasClient(hostname=registry.host, insecure=True)


# --- tests --------------------------------------------------------------------


def test_build_is_reproducible(image, tmp):
    again, r = build_image(tmp / "again")
    assert again == image["digest"]
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", again)
    # What the script printed is the manifest digest and what it wrote down.
    assert again == sha256(layout_blob(tmp / "again", again))
    assert (tmp / "again" / "digest").read_text().strip() == again
    assert image["stdout"].strip().splitlines()[-1] == image["digest"]
    # Byte for byte the same layout.
    first = sorted(p.relative_to(image["dir"]) for p in image["dir"].rglob("*") if p.is_file())
    second = sorted(p.relative_to(tmp / "again") for p in (tmp / "again").rglob("*") if p.is_file())
    assert first == second
    for rel in first:
        assert (image["dir"] / rel).read_bytes() == (tmp / "again" / rel).read_bytes(), rel
    index = json.loads((image["dir"] / "index.json").read_text())
    assert [m["digest"] for m in index["manifests"]] == [image["digest"]]
    assert index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"] == VERSION
    assert json.loads((image["dir"] / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}


def test_build_refuses_what_is_not_a_wasm_module(tmp):
    bogus = tmp / "not.wasm"
    bogus.write_bytes(b"\x7fELF not a wasm module")
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--wasm", str(bogus), "--out", str(tmp / "bogus")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0
    assert "asm" in r.stderr
    assert not (tmp / "bogus").exists()


def test_push_keeps_the_manifest_digest(image, pushed, registry):
    assert pushed == image["digest"]
    r = registry.manifest("loopguard", VERSION)
    assert r.status_code == 200, r.text
    assert r.headers["docker-content-digest"] == image["digest"]
    assert r.headers["content-type"] == MANIFEST_TYPE
    # The registry serves the very bytes that were built.
    assert r.content == layout_blob(image["dir"], image["digest"])
    # ... also by digest.
    assert registry.manifest("loopguard", image["digest"]).content == r.content


def test_oras_pulls_the_module_back(image, pushed, registry, oras_client):
    ref = f"{registry.host}/loopguard:{VERSION}"
    manifest = oras_client.get_manifest(ref, allowed_media_type=[MANIFEST_TYPE], validation_schema=oras.schemas.manifest)
    assert manifest["schemaVersion"] == 2
    assert manifest["mediaType"] == MANIFEST_TYPE
    assert manifest["config"]["mediaType"] == CONFIG_TYPE
    assert len(manifest["layers"]) == 1
    layer = manifest["layers"][0]
    assert layer["mediaType"] == OCI_LAYER

    blob = oras_client.get_blob(ref, layer["digest"]).content
    assert sha256(blob) == layer["digest"]
    assert len(blob) == layer["size"]
    config_blob = oras_client.get_blob(ref, manifest["config"]["digest"]).content
    assert sha256(config_blob) == manifest["config"]["digest"]
    assert len(config_blob) == manifest["config"]["size"]

    head = git("rev-parse", "HEAD")
    created = datetime.datetime.fromtimestamp(commit_time(), datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    annotations = manifest["annotations"]
    assert annotations["org.opencontainers.image.source"] == SOURCE
    assert annotations["org.opencontainers.image.version"] == VERSION
    assert annotations["org.opencontainers.image.revision"] in (head, head + "-dirty")
    assert annotations["org.opencontainers.image.created"] == created
    assert annotations["org.opencontainers.image.title"] == "loopguard"
    assert annotations["org.opencontainers.image.description"]
    assert annotations["module.wasm.image/variant"] == "compat"

    # The layer: gzip of a tar with exactly one regular file, plugin.wasm,
    # the module byte for byte, with fixed metadata.
    tar_bytes = gzip.decompress(blob)
    with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:") as tar:
        members = tar.getmembers()
        assert [m.name for m in members] == ["plugin.wasm"]
        (m,) = members
        assert m.isreg()
        assert (m.mode, m.uid, m.gid, m.uname, m.gname) == (0o644, 0, 0, "", "")
        assert m.mtime == commit_time()
        assert tar.extractfile(m).read() == Path(WASM).read_bytes()

    config = json.loads(config_blob)
    assert config["architecture"] == "wasm"
    assert config["os"] == "wasip1"
    assert config["created"] == created
    assert config["rootfs"] == {"type": "layers", "diff_ids": [sha256(tar_bytes)]}


def test_skopeo_pulls_the_same_image_back(image, pushed, registry, tmp):
    other = tmp / "pulled"
    skopeo(
        "copy",
        "--src-tls-verify=false",
        f"docker://{registry.host}/loopguard:{VERSION}",
        f"oci:{other}:{VERSION}",
    )
    index = json.loads((other / "index.json").read_text())
    assert [m["digest"] for m in index["manifests"]] == [image["digest"]]
    manifest = json.loads(layout_blob(other, image["digest"]))
    assert manifest == image["manifest"]
    layer = manifest["layers"][0]
    assert layout_blob(other, layer["digest"]) == layout_blob(image["dir"], layer["digest"])


def test_istio_takes_the_compat_path(pushed, registry, oras_client):
    ref = f"{registry.host}/loopguard:{VERSION}"
    manifest = oras_client.get_manifest(ref, allowed_media_type=[MANIFEST_TYPE])

    def fetch(descriptor: dict) -> bytes:
        blob = oras_client.get_blob(ref, descriptor["digest"]).content
        assert sha256(blob) == descriptor["digest"]  # as go-containerregistry verifies
        return blob

    variant, module = istio_extract(manifest, fetch)
    assert variant == "compat"
    assert module == Path(WASM).read_bytes()


def test_istio_checker_rejects_other_shapes(pushed, registry, oras_client):
    """The mirror of Istio's decision can fail: a layer of another media type,
    a tar+gzip without plugin.wasm, and no layers are rejected; the oci
    variant is taken by its own path."""
    ref = f"{registry.host}/loopguard:{VERSION}"
    manifest = oras_client.get_manifest(ref, allowed_media_type=[MANIFEST_TYPE])
    blobs = {manifest["layers"][0]["digest"]: oras_client.get_blob(ref, manifest["layers"][0]["digest"]).content}

    def fetch(descriptor: dict) -> bytes:
        return blobs[descriptor["digest"]]

    other_type = json.loads(json.dumps(manifest))
    other_type["layers"][0]["mediaType"] = "application/vnd.oci.image.layer.v1.tar"
    with pytest.raises(Rejected, match="invalid media type"):
        istio_extract(other_type, fetch)

    # A Docker manifest with the OCI layer type is not taken either.
    docker = json.loads(json.dumps(manifest))
    docker["mediaType"] = DOCKER_MANIFEST
    with pytest.raises(Rejected, match="invalid media type"):
        istio_extract(docker, fetch)

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo("module.wasm")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"\0asm"))
    wrong_name = gzip.compress(buf.getvalue(), mtime=0)
    blobs[sha256(wrong_name)] = wrong_name
    renamed = json.loads(json.dumps(manifest))
    renamed["layers"][0]["digest"] = sha256(wrong_name)
    with pytest.raises(Rejected, match="plugin.wasm not found"):
        istio_extract(renamed, fetch)

    with pytest.raises(Rejected):
        istio_extract({**manifest, "layers": []}, fetch)

    raw = Path(WASM).read_bytes()
    blobs[sha256(raw)] = raw
    artifact = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": manifest["config"],
        "layers": [
            {"mediaType": WASM_LAYER, "digest": sha256(raw), "size": len(raw)},
            {"mediaType": "application/vnd.module.wasm.runtime.config.v1+json", "digest": "sha256:0", "size": 0},
        ],
    }
    assert istio_extract(artifact, fetch) == ("oci", raw)


def test_make_push(image, registry, tmp):
    """`make push` (which runs `make image`) to REGISTRY=127.0.0.1:PORT/team:
    the registry then has team/loopguard:VERSION with the digest make printed,
    the same as the image built from the same module here."""
    make = need("make")
    need("skopeo")
    out = tmp / "make-image"
    # A clean environment for a top-level make (not a sub-make of `make e2e`).
    drop = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "REGISTRY", "IMAGE_TAG", "IMAGE_DIR", "IMAGE_WASM")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("IMAGE_")}
    r = subprocess.run(
        [
            make,
            "--no-print-directory",
            "push",
            f"REGISTRY={registry.host}/team",
            "PUSH_TLS_VERIFY=false",
            f"IMAGE_DIR={out}",
            f"IMAGE_WASM={WASM}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert r.returncode == 0, f"make push failed:\n{r.stdout[-10000:]}\n{r.stderr[-10000:]}"
    built = (out / "digest").read_text().strip()
    pushed_line = [line for line in r.stdout.splitlines() if line.startswith("pushed ")]
    assert pushed_line == [f"pushed {registry.host}/team/loopguard:{VERSION}@{built}"], r.stdout
    assert f"url: oci://{registry.host}/team/loopguard:{VERSION}" in r.stdout
    assert f"sha256: {built.removeprefix('sha256:')}" in r.stdout

    got = registry.manifest("team/loopguard", VERSION)
    assert got.status_code == 200, got.text
    assert got.headers["docker-content-digest"] == built
    # Same module, same commit, same tag and source: the same image as the
    # script built directly.
    assert built == image["digest"]

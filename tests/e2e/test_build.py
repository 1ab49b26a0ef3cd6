"""Whatever command a user types to build the module, the wasm file is the
filter: `cargo build --release --target wasm32-wasip1` at the workspace root
(the usual proxy-wasm habit) builds the filter module Envoy loads, and a
wasm build of the whole workspace stops with a message instead of putting
the CLI (whose binary is also named loopguard) over it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx

import harness as h

ROOT = Path(__file__).resolve().parents[2]
MODULE = ROOT / "target" / "wasm32-wasip1" / "release" / "loopguard.wasm"


def _leb(b: bytes, i: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        c = b[i]
        i += 1
        value |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return value, i


def exports(path: Path) -> list[str]:
    """The names a wasm module exports (its export section)."""
    b = path.read_bytes()
    assert b[:4] == b"\0asm", f"{path} is not a wasm module"
    i, names = 8, []
    while i < len(b):
        section = b[i]
        size, i = _leb(b, i + 1)
        end = i + size
        if section == 7:
            n, j = _leb(b, i)
            for _ in range(n):
                length, j = _leb(b, j)
                names.append(b[j : j + length].decode())
                j += length + 1  # kind
                _, j = _leb(b, j)  # index
        i = end
    return names


def cargo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [os.environ.get("CARGO", "cargo"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )


def is_filter(path: Path) -> bool:
    return any(e.startswith("proxy_abi_version_") for e in exports(path))


def test_a_plain_wasm_build_at_the_root_is_the_filter_envoy_loads(upstream, start_envoy):
    done = cargo("build", "--release", "--target", "wasm32-wasip1")
    assert done.returncode == 0, done.stderr
    assert is_filter(MODULE), f"{MODULE} exports {exports(MODULE)}: not a proxy-wasm module"
    assert "proxy_on_request_headers" in exports(MODULE)
    # And Envoy runs it (the suite's module is this file): a loop is still
    # stopped by what that command built.
    assert Path(h.WASM).resolve() == MODULE.resolve()
    # The Wasm filter under either host: this is about the Wasm build.
    filters = [h.wasm_filter(h.plugin([h.policy("p", threshold=2)])), h.buffer_filter(), h.ROUTER]
    e = start_envoy(h.bootstrap(None, upstream.port, http_filters=filters))
    with httpx.Client(base_url=e.url) as c:
        codes = [c.post("/v1/x", content=b'{"a":1}').status_code for _ in range(3)]
    assert codes == [200, 429, 429]


def test_a_wasm_build_of_the_whole_workspace_refuses_the_cli_and_keeps_the_filter():
    """In the dev profile: what lands where is the same in every profile,
    and the suite's own module (release) is never rebuilt under the Envoys
    that the other tests start meanwhile."""
    module = ROOT / "target" / "wasm32-wasip1" / "debug" / "loopguard.wasm"
    # --keep-going: the filter is linked whatever order cargo builds in.
    done = cargo("build", "--workspace", "--keep-going", "--target", "wasm32-wasip1")
    assert done.returncode != 0
    assert "loopguard-cli is a native command" in done.stderr
    assert "make cli" in done.stderr
    # The filter may be rebuilt (the CLI's features of the core are
    # unified in), but what lands on loopguard.wasm is the filter.
    assert is_filter(module), f"{module} exports {exports(module)}"

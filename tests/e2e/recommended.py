"""The recommended setup (the eval's RECOMMENDED: the policy of the shipped
examples/recommended/envoy.yaml) as one plugin configuration, on the local
table or with a store, for the tests that drive the SDKs through it."""

from __future__ import annotations

import sys

from harness import ROOT, plugin

sys.path.insert(0, str(ROOT / "eval"))
import eval as corpus  # noqa: E402


def recommended_config(store: dict | None) -> dict:
    """The recommended policy over every POST, headers held, bodies up to
    4 MiB; with `store`, counting in it."""
    spec = {"selector": {"methods": ["POST"]}, **corpus.RECOMMENDED}
    top = {"hold_request_headers": True, "max_body_bytes": 4 << 20}
    if store:
        top["store"] = store
    return plugin([{"id": "agents", "spec": spec}], **top)

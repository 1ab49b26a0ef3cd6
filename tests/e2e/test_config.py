"""An invalid configuration stops the plugin from starting, and Envoy's log
names the policy, the field and the reason in one line."""

import pytest

from harness import bootstrap, plugin, policy

CASES = [
    (
        plugin([policy("llm-policy", threshold=1)]),
        'policy "llm-policy": loop_detection.threshold_identical_requests must be >= 2 (got 1)',
    ),
    (
        plugin([policy("llm-policy", threshold=1025)]),
        'policy "llm-policy": loop_detection.threshold_identical_requests must be <= 1024 (got 1025)',
    ),
    (
        plugin([policy("a", window=0)]),
        'policy "a": loop_detection.window_seconds must be >= 1 (got 0)',
    ),
    (
        plugin([policy("typo", treshold=3)]),
        'policy "typo": loop_detection.treshold is not a known field',
    ),
    (
        plugin([policy("thr", action="throttle", throttle_step_ms=5, throttle_max_delay_ms=60000)]),
        'policy "thr": loop_detection.throttle_max_delay_ms needs 12000 identical hits to reach its cap',
    ),
    (
        plugin([policy("cd", action="warn", cooldown_seconds=30)]),
        'policy "cd": loop_detection.cooldown_seconds needs a reject action',
    ),
    (
        plugin([policy("esc", escalation=[{"at": 3, "action": "warn"}, {"at": 3, "action": "reject"}], threshold=None)]),
        'policy "esc": loop_detection.escalation[1].at must be greater than the previous step\'s (3 <= 3)',
    ),
    (
        plugin([policy("act", action="block")]),
        'policy "act": loop_detection.action must be "reject", "throttle" or "warn" (got "block")',
    ),
    (
        plugin([policy("keys", limit_keys=["cookie:session"])]),
        'policy "keys": limit_keys[0] must be header:<name>, query:<name>, jwt:<claim>, jwt_verified:<claim> or ip:address',
    ),
    (
        plugin([policy("bad id")]),
        "policies[0].id must match [A-Za-z0-9_-]{1,64}",
    ),
    (
        plugin([policy("dup"), policy("dup")]),
        'policy "dup": id is used by more than one policy',
    ),
    (
        plugin([policy("m")], max_tracked_fingerprint=10),
        'max_tracked_fingerprint is not a known field (did you mean "max_tracked_fingerprints"?)',
    ),
    ('{"policies": [', "configuration is not valid JSON"),
]


@pytest.mark.parametrize("config,message", CASES, ids=[m[:40] for _, m in CASES])
def test_invalid_configuration_fails_startup_naming_the_field(upstream, start_envoy, config, message):
    envoy = start_envoy.make(bootstrap(config, upstream.port))
    log = envoy.expect_startup_failure()
    lines = [line for line in log.splitlines() if "invalid configuration: " in line]
    assert len(lines) >= 1, log
    assert message in lines[0], lines[0]


def test_valid_configuration_logs_what_it_loaded(upstream, start_envoy):
    cfg = plugin([policy("one"), policy("two")], max_tracked_fingerprints=1000)
    envoy = start_envoy(bootstrap(cfg, upstream.port))
    assert "configured 2 policies (one, two), tracking up to 1000 fingerprints" in envoy.log()

"""Observability in real Envoy: labelled Prometheus metrics with exact values,
one structured event per detected loop, the decision in the access log, and
signed webhook alerts (one per loop; a dead receiver costs nothing)."""

import hashlib
import hmac
import json
import time

import httpx

from harness import ROOT, Schedule, Upstream, bootstrap, free_port, load_yaml, localize, on_schedule, plugin, policy, wait_for
from observing import alerts_sent, events

SECRET = "s3cret-for-tests"
EXAMPLE = ROOT / "examples" / "observability" / "envoy.yaml"


def observability_envoy(start_envoy, api_port, alerts_port, secret=SECRET, **mutate):
    cfg = localize(load_yaml(EXAMPLE), {"api": api_port, "alerts": alerts_port})
    return start_envoy(cfg, env={"LOOPGUARD_WEBHOOK_SECRET": secret} if secret else {}, **mutate)


def test_prometheus_labels_events_access_log_and_one_signed_alert(upstream, start_envoy):
    receiver = Upstream(responder=lambda r: (200, {"ok": True}))
    try:
        e = observability_envoy(start_envoy, upstream.port, receiver.port)
        with httpx.Client(base_url=e.url, headers={"authorization": "Bearer sk-observed"}) as c:
            loop = [c.post("/v1/chat/completions", content=b'{"same": 1}').status_code for _ in range(6)]
            other = [c.post("/v1/chat/completions", content=f'{{"n": {i}}}'.encode()).status_code for i in range(2)]
            c.get("/healthz")  # matches no policy
        assert loop == [200, 200, 429, 429, 429, 429]
        assert other == [200, 200]
        prom = e.prometheus()
        assert prom['loopguard_requests_total{}'] == 9
        assert prom['loopguard_matched_total{policy="agents"}'] == 8
        assert prom['loopguard_rejected_total{policy="agents"}'] == 4
        assert prom['loopguard_detected_total{policy="agents",mode="enforce"}'] == 1
        assert prom['loopguard_detected_total{policy="agents",mode="shadow"}'] == 0
        assert prom['loopguard_throttled_total{policy="agents"}'] == 0
        assert prom['loopguard_table_entries_used{}'] == 3
        assert prom['loopguard_bodies_skipped_total{reason="too_large"}'] == 0

        # One structured event for the loop, not one per rejected retry; no
        # raw key or body in it.
        [event] = events(e)
        assert {k: event[k] for k in ("event", "policy", "hit_count", "window_seconds", "action", "mode", "cooldown_seconds", "suppressed")} == {
            "event": "loop.detected", "policy": "agents", "hit_count": 3, "window_seconds": 60, "action": "reject",
            "mode": "enforce", "cooldown_seconds": 30, "suppressed": 0}
        assert len(event["fingerprint"]) == 32
        assert "sk-observed" not in e.log() and '"same"' not in json.dumps(event)

        # The access log line carries the decision (Envoy flushes its
        # access log buffer about once a second).
        access_lines = lambda: [line for line in e.log().splitlines() if '"POST /v1/chat/completions"' in line]  # noqa: E731
        assert wait_for(lambda: len(access_lines()) == 8)
        access = access_lines()
        first, tripped = (json.loads(line.split("loopguard=", 1)[1]) for line in (access[0], access[2]))
        assert first == {"policy": "agents", "mode": "enforce", "action": "allow", "fingerprint": event["fingerprint"], "count": 1}
        assert tripped == {"policy": "agents", "mode": "enforce", "action": "reject", "fingerprint": event["fingerprint"], "count": 3}
        assert wait_for(lambda: any('"GET /healthz"' in line for line in e.log().splitlines()))
        assert [line for line in e.log().splitlines() if '"GET /healthz"' in line][0].endswith("loopguard=-")

        # Exactly one alert, signed.
        assert wait_for(lambda: receiver.count >= 1)
        alerts_sent(e)  # every alert of the traffic so far: a second would be here
        assert receiver.count == 1
        alert = receiver.requests[0]
        assert alert["method"] == "POST" and alert["path"] == "/loopguard"
        assert alert["headers"]["host"] == "hooks.example.com"
        expected = "sha256=" + hmac.new(SECRET.encode(), alert["body"], hashlib.sha256).hexdigest()
        assert alert["headers"]["x-loopguard-signature"] == expected
        payload = json.loads(alert["body"])
        assert payload["event"] == "loop.detected" and payload["policy"] == "agents"
        assert payload["fingerprint"] == event["fingerprint"] and payload["hit_count"] == 3
        assert payload["action"] == "reject" and payload["cooldown_seconds"] == 30
        assert payload["timestamp"].endswith("Z") and payload["timestamp"][:4] == time.strftime("%Y", time.gmtime())
        assert wait_for(lambda: e.prometheus().get('loopguard_webhook_total{result="sent"}') == 1)
    finally:
        receiver.stop()


def test_a_dead_receiver_neither_slows_nor_fails_requests(upstream, start_envoy):
    dead = free_port()  # nothing listens here
    e = observability_envoy(start_envoy, upstream.port, dead, timing=True)
    with httpx.Client(base_url=e.url) as c:
        # Many distinct loops: an alert each.
        codes = []
        for i in range(20):
            for _ in range(3):
                codes.append(c.post("/v1/x", content=f"loop {i}".encode()).status_code)
    assert codes == [200, 200, 429] * 20
    # The time Envoy spent on the 60 requests, by its own clock (the
    # client's scheduling left out).
    took = sum(t.total for t in e.timings(60, path="/v1/x"))
    assert took < 5, f"Envoy spent {took:.1f}s on 60 requests"
    assert wait_for(lambda: e.prometheus().get('loopguard_webhook_total{result="failed"}', 0) == 20)
    assert e.prometheus()['loopguard_webhook_total{result="sent"}'] == 0
    assert "webhook alert failed" in e.log()


def test_missing_secret_stops_the_plugin_from_starting(upstream, start_envoy):
    cfg = localize(load_yaml(EXAMPLE), {"api": upstream.port, "alerts": upstream.port})
    log = start_envoy.make(cfg).expect_startup_failure()
    assert "alerts.webhook.hmac_secret_env names LOOPGUARD_WEBHOOK_SECRET, which is not set in the VM environment" in log


def test_repeats_within_a_window_are_summarised_in_the_next_event(upstream, start_envoy):
    e = start_envoy(bootstrap(plugin([policy("p", threshold=2, window=2)]), upstream.port))

    def scenario(attempt):
        path = f"/v1/s/{attempt}"
        with httpx.Client(base_url=e.url) as c:
            s = Schedule()
            hit = lambda: s.send(lambda: c.get(path))  # noqa: E731
            burst = [hit() for _ in range(6)]  # detections at hits 2..6: one event, 4 counted
            s.ensure(burst[-1].within(2.0, of=burst[1]), "the detections at hits 2..6 within 2 s")
            s.at(burst[-1].end + 2.1)
            later = [hit() for _ in range(2)]  # the loop goes on: a new window, a new event
            s.ensure(later[1].within(2.0, of=later[0]), "the last two hits within one window")
        fingerprint = burst[1].response.json()["error"]["fingerprint"]
        got = [ev for ev in events(e) if ev["fingerprint"] == fingerprint]
        assert [(ev["hit_count"], ev["suppressed"]) for ev in got] == [(2, 0), (2, 4)]

    on_schedule(scenario)


def test_shadow_detections_are_events_too_and_throttle_delays_a_histogram(upstream, start_envoy):
    cfg = plugin([
        policy("watch", threshold=2, mode="shadow", selector={"pathPrefix": "/s"}),
        policy("slow", threshold=2, action="throttle", throttle_step_ms=10),
    ])
    tagged = bootstrap(cfg, upstream.port)
    tagged["stats_config"] = load_yaml(EXAMPLE)["stats_config"]
    e = start_envoy(tagged)
    with httpx.Client(base_url=e.url) as c:
        for _ in range(3):
            c.get("/s/x")
            c.get("/v1/t")
    assert [ev["mode"] for ev in events(e)] == ["shadow", "enforce"] or [ev["mode"] for ev in events(e)] == ["enforce", "shadow"]
    prom = e.prometheus()
    assert prom['loopguard_detected_total{policy="watch",mode="shadow"}'] == 1
    assert prom['loopguard_shadow_total{policy="watch",action="reject"}'] == 2
    assert prom['loopguard_throttled_total{policy="slow"}'] == 2
    # Histograms reach the admin endpoint on Envoy's stats flush.
    assert wait_for(lambda: e.prometheus().get('loopguard_throttle_delay_ms_count{policy="slow"}') == 2, timeout=10)

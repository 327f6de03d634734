"""The scale-out's placement book, replica ranking and autoscaling policy, without a cluster
(agent/commands/ray_serve.py keeps them free of Ray)."""

from __future__ import annotations

import asyncio
import sys
from types import SimpleNamespace

import pytest

from agent.commands.ray_serve import (
    ACTIVE_CALLS,
    ActiveCallsPolicy,
    Places,
    RecentPlacements,
    ScaleOptions,
    VoiceReplica,
    media_urls,
    placement_page,
    rank_replicas,
)


def test_a_reservation_holds_a_place_until_its_call_arrives():
    p = Places(2, hold_s=10.0)
    assert p.reserve(0.0, live=0, served=0) == ""
    assert p.reserve(1.0, live=0, served=0) == ""
    assert p.free(1.0, live=0, served=0) == 0
    assert p.reserve(2.0, live=0, served=0).startswith("full")
    # the first call arrives: it took its reservation, the place is still used (live)
    assert p.free(3.0, live=1, served=1) == 0
    assert p.held(3.0, served=1) == 1
    # it hangs up: one place free again, the other still promised
    assert p.free(4.0, live=0, served=1) == 1


def test_a_reservation_whose_call_never_comes_lapses():
    p = Places(1, hold_s=10.0)
    assert p.reserve(0.0, 0, 0) == ""
    assert p.reserve(9.9, 0, 0) != ""
    assert p.free(10.0, 0, 0) == 1
    assert p.reserve(10.0, 0, 0) == ""


def test_a_call_that_came_without_a_reservation_never_makes_room():
    p = Places(2)
    assert p.reserve(0.0, 0, 0) == ""
    # a call arrived straight (no placement): the book errs towards refusing
    assert p.free(1.0, live=1, served=1) == 1
    assert p.free(1.0, live=2, served=2) == 0


def test_a_draining_replica_promises_nothing():
    p = Places(4)
    p.draining = True
    assert p.reserve(0.0, 0, 0) == "draining"
    assert p.free(0.0, 0, 0) == 0


def test_places_need_room():
    with pytest.raises(ValueError):
        Places(0)


def test_replicas_are_asked_most_free_first_and_never_twice():
    stats = {"a": {"free": 1}, "b": {"free": 3}, "c": {"free": 0}, "d": {}}
    assert rank_replicas(stats, ()) == ["b", "a", "d", "c"]
    assert rank_replicas(stats, ["b"]) == ["a", "d", "c"]
    # all asked: all of them again (the one that gets it sees itself in `tried` and says so)
    assert sorted(rank_replicas(stats, ["a", "b", "c", "d"])) == ["a", "b", "c", "d"]
    assert rank_replicas({}, ()) == []


def test_a_burst_of_placements_between_reports_is_spread():
    recent = RecentPlacements()
    stats = {"a": {"free": 8, "at": 1.0}, "b": {"free": 7, "at": 1.0}}
    order = []
    for _ in range(7):
        first = rank_replicas(recent.adjusted(stats), ())[0]
        recent.sent(first)
        order.append(first)
    assert order.count("a") == 4 and order.count("b") == 3, order  # both left with 4 places
    # a fresh report already counts what was placed: the router's count starts again
    assert recent.adjusted({"a": {"free": 5, "at": 2.0}, "b": stats["b"]})["a"]["free"] == 5
    assert recent.adjusted({"a": {}, "b": None}) == {"a": {}, "b": None}


def _ctx(calls: dict[str, float] | None, current: int, low: int = 1, high: int = 10):
    return SimpleNamespace(aggregated_metrics=None if calls is None else {ACTIVE_CALLS: calls},
                           current_num_replicas=current, capacity_adjusted_min_replicas=low,
                           capacity_adjusted_max_replicas=high)


def test_the_policy_asks_for_replicas_by_active_calls():
    policy = ActiveCallsPolicy(calls_per_replica=4)
    assert policy(_ctx({"a": 4.0, "b": 4.0}, 2))[0] == 2
    assert policy(_ctx({"a": 4.0, "b": 5.0}, 2))[0] == 3
    assert policy(_ctx({"a": 1.0, "b": 0.0}, 2))[0] == 1
    assert policy(_ctx({"a": 30.0}, 1, high=4))[0] == 4
    assert policy(_ctx({"a": 0.0}, 1, low=0))[0] == 1  # live replicas never go to zero alone
    assert policy(_ctx(None, 3))[0] == 3  # nothing reported yet: stay
    with pytest.raises(ValueError):
        ActiveCallsPolicy(0)


def test_a_replica_reports_live_and_promised_calls_as_its_metric():
    replica = object.__new__(VoiceReplica)  # no Ray: its server and book, by hand
    replica.server = SimpleNamespace(live_calls=2, served=5)
    replica.places = Places(8, served=5)
    replica.replica_id = "r1"
    replica.twilio_calls = 0
    replica.urls = media_urls("127.0.0.1", 9000, "")
    placed = asyncio.run(replica.reserve())
    assert placed["ok"] and placed["twilio"] == "ws://127.0.0.1:9000/twilio/media"
    assert asyncio.run(replica.record_autoscaling_stats()) == {ACTIVE_CALLS: 3.0}
    stats = asyncio.run(replica.record_routing_stats())
    assert stats["free"] == 5 and not stats["draining"]
    refusal = asyncio.run(replica.reserve(tried=["r1"]))
    assert not refusal["ok"] and refusal["exhausted"]
    # a Twilio stream arriving takes its reservation off the book, as a browser call does
    replica.twilio_calls = 1
    replica.server.live_calls = 3
    assert asyncio.run(replica.record_autoscaling_stats()) == {ACTIVE_CALLS: 3.0}


def test_replicas_outlast_their_drain_and_autoscale_on_calls():
    opts = ScaleOptions(max_calls=8, drain_timeout_s=60.0).deployment_options()
    assert opts["graceful_shutdown_timeout_s"] >= 60.0
    policy = opts["autoscaling_config"]["policy"]
    assert policy["policy_function"] == "agent.commands.ray_serve:ActiveCallsPolicy"
    assert policy["policy_kwargs"] == {"calls_per_replica": 6.0}
    fixed = ScaleOptions(replicas=3).deployment_options()
    assert fixed["num_replicas"] == 3 and "autoscaling_config" not in fixed


def test_the_autoscaling_config_is_one_serve_accepts():
    pytest.importorskip("ray.serve", reason="needs the ray extra")
    from ray.serve.config import AutoscalingConfig

    cfg = AutoscalingConfig(**ScaleOptions(max_calls=4).deployment_options()["autoscaling_config"])
    assert cfg.policy.get_policy() is ActiveCallsPolicy


def test_media_urls_carry_the_token_and_the_page_asks_for_a_place():
    urls = media_urls("10.0.0.5", 8123, "a b")
    assert urls["ws"] == "ws://10.0.0.5:8123/ws?token=a%20b"
    assert urls["offer"] == "http://10.0.0.5:8123/offer?token=a%20b"
    assert media_urls("::1", 80, "")["ws"] == "ws://[::1]:80/ws"
    page = placement_page("<html><head><title>x</title></head></html>")
    assert '<head>\n<meta name="voxline-placement" content="/place">' in page


def test_the_module_imports_no_ray():
    assert "agent.commands.ray_serve" in sys.modules
    import subprocess

    code = "import sys, agent.commands.ray_serve; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

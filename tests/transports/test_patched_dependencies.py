"""Pin what we patch: every dependency whose private internals voxline touches is capped below
its next minor version in pyproject.toml, the installed version is within the cap, and a test
proves each patch took (so raising a cap means re-running these, not hoping)."""

from __future__ import annotations

import asyncio
import re
import tomllib
import urllib.request
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LOOPBACK_TEST = "tests/transports/test_webrtc_loopback.py"
THIS_TEST = "tests/transports/test_patched_dependencies.py"

# dependency -> what we reach into, and the tests that prove the patch took
PATCHED: dict[str, tuple[str, list[str]]] = {
    "aiortc": (
        "transports/webrtc/peer.py: the receiver's jitter buffer (RTCRtpReceiver.__jitter_buffer, "
        "JitterBuffer._remove_frame/_origin/_packets, RtpPacket._data), the transceiver's "
        "_codecs; transports/webrtc/track.py: the sender's encoder (RTCRtpSender.__encoder)",
        [f"{LOOPBACK_TEST}::test_audio_receivers_release_each_packet_as_it_arrives",
         f"{LOOPBACK_TEST}::test_webrtc_call_audio_both_ways_events_and_hangup"],
    ),
    "aioice": (
        "transports/webrtc/ice.py: aioice.ice.get_host_addresses, replaced process-wide",
        [f"{THIS_TEST}::test_loopback_ice_makes_aioice_gather_127_0_0_1"],
    ),
    "aiohttp": (
        "transports/server.py: TCPSite._server, for the port a port-0 server got",
        [f"{THIS_TEST}::test_a_server_on_port_0_learns_its_port_and_serves_the_page"],
    ),
}


def _declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    lines = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        lines.extend(extra)
    return [Requirement(line) for line in lines]


@pytest.mark.parametrize("name", sorted(PATCHED))
def test_a_patched_dependency_is_capped_below_its_next_minor_and_installed_within(name):
    declared = [r for r in _declared() if canonicalize_name(r.name) == name]
    assert declared, f"{name} is patched ({PATCHED[name][0]}) but not declared in pyproject.toml"
    installed = Version(version(name))
    next_minor = Version(f"{installed.major}.{installed.minor + 1}")
    for req in declared:  # every extra that names it
        assert any(s.operator in ("<", "<=", "==", "~=") for s in req.specifier), (
            f"{req} has no upper bound, but we patch {name}: {PATCHED[name][0]}")
        assert installed in req.specifier, (
            f"{name} {installed} is installed but pyproject.toml asks {req}: re-run "
            f"{', '.join(PATCHED[name][1])} on it before moving the cap")
        assert next_minor not in req.specifier, (
            f"{req} admits {name} {next_minor}, which no test has checked our patches against")


@pytest.mark.parametrize("name", sorted(PATCHED))
def test_each_patch_has_a_test_that_proves_it(name):
    for node in PATCHED[name][1]:
        path, test = node.split("::")
        source = (ROOT / path).read_text(encoding="utf-8")
        assert re.search(rf"^def {test}\(", source, re.M), f"{node} is gone"


def test_loopback_ice_makes_aioice_gather_127_0_0_1():
    import aioice

    from transports.webrtc.ice import LOOPBACK, use_loopback_ice

    async def gather() -> list[str]:
        conn = aioice.Connection(ice_controlling=True)
        await conn.gather_candidates()
        hosts = [c.host for c in conn.local_candidates]
        await conn.close()
        return hosts

    use_loopback_ice()  # aioice by itself never gathers a loopback address
    assert asyncio.run(gather()) == [LOOPBACK]


def test_a_server_on_port_0_learns_its_port_and_serves_the_page():
    from transports.server import WEB_ROOT, VoiceServer

    async def main() -> tuple[int, bytes]:
        server = VoiceServer(lambda: None, port=0)
        port = await server.start()
        try:
            page = await asyncio.to_thread(
                lambda: urllib.request.urlopen(server.url, timeout=5).read())
        finally:
            await server.stop()
        return port, page

    port, page = asyncio.run(main())
    assert port != 0
    assert page == (WEB_ROOT / "index.html").read_bytes()

"""A voice replica's ``/offer`` answers the scale-out ingress's page, which lives on another
origin (``agent.commands.ray_serve.allow_cross_origin_offers``): a real aiortc peer's offer,
sent as a browser sends it across origins — an OPTIONS preflight, then the JSON POST with its
Origin — gets its answer with the CORS headers a browser needs to read it; another site's
preflight and offer are refused."""

from __future__ import annotations

import asyncio

import aiohttp
from aiortc import RTCPeerConnection

from agent.commands.ray_serve import allow_cross_origin_offers
from transports.server import VoiceServer
from transports.webrtc.ice import rtc_configuration, use_loopback_ice

INGRESS = "http://127.0.0.1:8000"  # the page's origin: Serve's proxy


def test_the_ingress_page_may_offer_across_origins_and_another_site_may_not(new_session):
    async def main():
        use_loopback_ice()
        server = VoiceServer(new_session, port=0, allowed_origins=[INGRESS])
        allow_cross_origin_offers(server.app, [INGRESS])
        await server.start()
        url = f"http://127.0.0.1:{server.port}/offer"
        pc = RTCPeerConnection(rtc_configuration())
        pc.createDataChannel("events")
        pc.addTransceiver("audio")
        await pc.setLocalDescription(await pc.createOffer())
        offer = {"sdp": pc.localDescription.sdp, "type": "offer"}
        out = {}
        try:
            async with aiohttp.ClientSession() as http:
                preflight = {"Origin": INGRESS, "Access-Control-Request-Method": "POST",
                             "Access-Control-Request-Headers": "content-type"}
                async with http.options(url, headers=preflight) as r:
                    out["preflight"] = (r.status, dict(r.headers))
                async with http.post(url, json=offer, headers={"Origin": INGRESS}) as r:
                    out["offer"] = (r.status, dict(r.headers), await r.json())
                evil = {**preflight, "Origin": "https://evil.example"}
                async with http.options(url, headers=evil) as r:
                    out["evil_preflight"] = r.status
                async with http.post(url, json=offer,
                                     headers={"Origin": "https://evil.example"}) as r:
                    out["evil_offer"] = (r.status, dict(r.headers))
        finally:
            await pc.close()
            await server.stop()
        return out

    out = asyncio.run(main())
    status, headers = out["preflight"]
    assert status == 204 and headers["Access-Control-Allow-Origin"] == INGRESS
    assert "POST" in headers["Access-Control-Allow-Methods"]
    assert "content-type" in headers["Access-Control-Allow-Headers"].lower()
    status, headers, answer = out["offer"]
    assert status == 200 and answer["type"] == "answer" and "m=audio" in answer["sdp"]
    assert headers["Access-Control-Allow-Origin"] == INGRESS
    assert out["evil_preflight"] == 403
    status, headers = out["evil_offer"]
    assert status == 403 and "Access-Control-Allow-Origin" not in headers

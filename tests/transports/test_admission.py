"""The one admission policy, sans-I/O: which checks each route gets, when a server counts as
exposed, the call limit across routes, and that every refusal is counted by its reason."""

from __future__ import annotations

import pytest
from twilio_signing import AUTH_TOKEN, sign

from agent.errors import ConfigError
from transports.admission import Admission, CallRequest, Refusal, Route, Ticket


def browser(query: dict[str, str] | None = None) -> CallRequest:
    return CallRequest(Route.BROWSER, "/ws", {}, query or {})


def twilio(route: Route, target: str, signature: str = "", host: str = "127.0.0.1:8080",
           form: dict[str, str] | None = None) -> CallRequest:
    headers = {"Host": host, **({"X-Twilio-Signature": signature} if signature else {})}
    return CallRequest(route, target, headers, {}, tuple((form or {}).items()))


def test_loopback_admits_browser_and_twilio_calls_without_credentials() -> None:
    admission = Admission("127.0.0.1")
    admission.require_twilio()  # nothing to check on loopback without a public URL
    assert isinstance(admission.admit(browser()), Ticket)
    assert isinstance(admission.admit(twilio(Route.TWILIO_MEDIA, "/twilio/media")), Ticket)
    assert admission.active == 2 and admission.refused_total == 0


def test_off_loopback_the_token_applies_to_browser_calls() -> None:
    admission = Admission("0.0.0.0", token="s3cret", twilio_auth_token=AUTH_TOKEN)
    refusal = admission.admit(browser())
    assert isinstance(refusal, Refusal) and refusal.status == 401 and "?token=" in refusal.text
    assert isinstance(admission.admit(browser({"token": "s3cret"})), Ticket)
    # the browser's token is no Twilio credential: Twilio's routes want Twilio's signature
    refusal = admission.admit(CallRequest(Route.TWILIO_MEDIA, "/twilio/media?token=s3cret",
                                          {"Host": "h"}, {"token": "s3cret"}))
    assert isinstance(refusal, Refusal) and refusal.status == 403
    assert admission.refused == {"token": 1, "signature": 1, "origin": 0, "host": 0,
                                 "limit": 0, "client_limit": 0, "draining": 0}


def test_a_public_url_makes_a_loopback_server_exposed() -> None:
    # a tunnel to 127.0.0.1 is reachable from anywhere: the token and Twilio's signature apply
    admission = Admission("127.0.0.1", public_url="https://bot.example")
    assert admission.exposed and admission.auth.required
    with pytest.raises(ConfigError, match="--twilio-auth-token or \\$TWILIO_AUTH_TOKEN"):
        admission.require_twilio()
    with pytest.raises(ConfigError, match="off loopback"):
        Admission("0.0.0.0").require_twilio()
    # had the check been skipped, Twilio's routes still refuse rather than serve open
    refusal = admission.admit(twilio(Route.TWILIO_MEDIA, "/twilio/media"))
    assert isinstance(refusal, Refusal) and refusal.status == 403
    Admission("0.0.0.0", twilio_auth_token=AUTH_TOKEN).require_twilio()


def test_twilio_signature_is_checked_over_the_public_url() -> None:
    admission = Admission("127.0.0.1", public_url="https://bot.example/",
                          twilio_auth_token=AUTH_TOKEN)
    form = {"CallSid": "CA1", "From": "+15550001"}
    good = sign("https://bot.example/twilio/twiml?x=1", form)
    # the Host the server sees (a proxy's, or 127.0.0.1) is not what Twilio signed
    assert isinstance(admission.admit(twilio(Route.TWILIO_WEBHOOK, "/twilio/twiml?x=1", good,
                                             form=form)), Ticket)
    assert admission.active == 0  # the webhook holds no place: the call is its media stream
    tampered = {**form, "From": "+15550002"}
    for request in (twilio(Route.TWILIO_WEBHOOK, "/twilio/twiml?x=1", good, form=tampered),
                    twilio(Route.TWILIO_WEBHOOK, "/twilio/twiml?x=2", good, form=form),
                    twilio(Route.TWILIO_WEBHOOK, "/twilio/twiml?x=1", "", form=form)):
        refusal = admission.admit(request)
        assert isinstance(refusal, Refusal) and refusal.status == 403
        assert "https://bot.example/twilio/twiml?x=" in refusal.text  # says which URL it checked
    media = sign("wss://bot.example/twilio/media")
    assert isinstance(admission.admit(twilio(Route.TWILIO_MEDIA, "/twilio/media", media)), Ticket)
    assert admission.refused["signature"] == 3 and admission.active == 1


def test_without_a_public_url_the_request_host_is_signed() -> None:
    admission = Admission("127.0.0.1", twilio_auth_token=AUTH_TOKEN)
    signature = sign("ws://127.0.0.1:8080/twilio/media")
    assert isinstance(admission.admit(twilio(Route.TWILIO_MEDIA, "/twilio/media", signature)),
                      Ticket)
    assert admission.public_base("https", "h:1", websocket=True) == "wss://h:1"


def test_the_limit_counts_every_route_and_tickets_give_places_back() -> None:
    admission = Admission("127.0.0.1", max_calls=2)
    first = admission.admit(browser())
    second = admission.admit(twilio(Route.TWILIO_MEDIA, "/twilio/media"))
    assert isinstance(first, Ticket) and isinstance(second, Ticket)
    for request in (browser(), twilio(Route.TWILIO_MEDIA, "/twilio/media"),
                    twilio(Route.TWILIO_WEBHOOK, "/twilio/twiml")):
        refusal = admission.admit(request)
        assert isinstance(refusal, Refusal) and refusal.status == 503
        assert "limit of 2 calls" in refusal.text
    assert admission.refused["limit"] == 3
    first.release()
    first.release()  # a second release gives nothing back twice
    assert admission.active == 1
    assert isinstance(admission.admit(twilio(Route.TWILIO_MEDIA, "/twilio/media")), Ticket)


def page(origin: str | None, host: str = "127.0.0.1:8080", peer: str = "") -> CallRequest:
    headers = {"Host": host, **({"Origin": origin} if origin is not None else {})}
    return CallRequest(Route.BROWSER, "/ws", headers, {}, peer=peer)


def test_a_foreign_origin_is_refused_and_the_own_page_admitted() -> None:
    admission = Admission("127.0.0.1")
    for own in ("http://127.0.0.1:8080", "http://127.0.0.1:8080/", "HTTP://127.0.0.1:8080"):
        assert isinstance(admission.admit(page(own)), Ticket), own
    assert isinstance(admission.admit(page(None)), Ticket)  # no Origin: not a browser page
    # cross-site WebSocket hijacking: another site's page, another port's, a sandboxed frame
    for foreign in ("https://evil.example", "http://127.0.0.1:9999", "null",
                    "http://127.0.0.1:8080.evil.example"):
        refusal = admission.admit(page(foreign))
        assert isinstance(refusal, Refusal) and refusal.status == 403, foreign
        assert "--allow-origin" in refusal.text
    assert admission.refused["origin"] == 4
    allowed = Admission("127.0.0.1", allowed_origins=["https://app.example"])
    assert isinstance(allowed.admit(page("https://app.example")), Ticket)
    assert isinstance(Admission("127.0.0.1", allowed_origins=["*"]).admit(page("null")), Ticket)


def test_a_loopback_server_answers_only_to_loopback_names() -> None:
    # DNS rebinding: evil.example resolves to 127.0.0.1, the page is same-origin by its Host
    admission = Admission("127.0.0.1")
    for host in ("127.0.0.1:8080", "localhost:8080", "[::1]:8080", "LOCALHOST", "a.localhost"):
        assert isinstance(admission.admit(page(None, host)), Ticket), host
    for host in ("evil.example:8080", "127.0.0.1.evil.example", "[::1", "0.0.0.0:8080"):
        refusal = admission.admit(page(f"http://{host}", host))
        assert isinstance(refusal, Refusal) and refusal.reason == "host", host
    assert isinstance(Admission("127.0.0.1", allowed_hosts=["box.lan"]).admit(
        page("http://box.lan:8080", "box.lan:8080")), Ticket)
    # behind a public URL its host and page are the server's own; off loopback any Host goes
    # (the token guards it)
    public = Admission("127.0.0.1", token="t", public_url="https://bot.example")
    assert isinstance(public.admit(CallRequest(
        Route.BROWSER, "/ws", {"Host": "bot.example", "Origin": "https://bot.example"},
        {"token": "t"})), Ticket)
    exposed = Admission("0.0.0.0", token="t")
    assert isinstance(exposed.admit(CallRequest(
        Route.BROWSER, "/ws", {"Host": "10.1.2.3:8080"}, {"token": "t"})), Ticket)


def test_one_client_address_holds_at_most_its_share() -> None:
    admission = Admission("0.0.0.0", token="t", max_calls=10, max_calls_per_client=2)

    def call(peer: str) -> Ticket | Refusal:
        return admission.admit(CallRequest(Route.BROWSER, "/ws", {}, {"token": "t"}, peer=peer))

    a1, a2 = call("203.0.113.5"), call("203.0.113.5")
    assert isinstance(a1, Ticket) and isinstance(a2, Ticket)
    refusal = call("203.0.113.5")
    assert isinstance(refusal, Refusal) and refusal.status == 429 and not refusal.busy
    assert isinstance(call("198.51.100.7"), Ticket)  # another client is not held back
    for _ in range(5):  # loopback (a local reverse proxy) is not counted
        assert isinstance(call("127.0.0.1"), Ticket)
    a1.release()
    a1.release()  # twice: still one place back
    assert isinstance(call("203.0.113.5"), Ticket)
    assert admission.per_client["203.0.113.5"] == 2 and admission.refused["client_limit"] == 1
    assert admission.active == 8


def test_a_draining_server_refuses_every_call_with_the_reason_and_twilio_hears_busy() -> None:
    admission = Admission("127.0.0.1")
    held = admission.admit(browser())
    admission.draining = True
    for request in (browser(), twilio(Route.TWILIO_MEDIA, "/twilio/media"),
                    twilio(Route.TWILIO_WEBHOOK, "/twilio/twiml")):
        refusal = admission.admit(request)
        assert isinstance(refusal, Refusal) and refusal.status == 503
        assert refusal.reason == "draining" and "shutting down" in refusal.text
        assert refusal.busy  # the TwiML answers a busy tone, not an application error
    assert admission.refused["draining"] == 3 and admission.active == 1
    assert isinstance(held, Ticket)
    held.release()  # the live call's end, as usual
    assert admission.active == 0

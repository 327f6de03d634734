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
    assert admission.refused == {"token": 1, "signature": 1, "limit": 0}


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

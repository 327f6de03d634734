"""Twilio's request signature against the example in Twilio's documentation, the default-port
respelling Twilio's helper libraries accept, and what must not pass."""

from __future__ import annotations

from twilio_signing import sign

from transports.twilio.signature import signature_matches, twilio_signature

# the worked example of Twilio's "Validating requests" documentation
DOC_URL = "https://mycompany.com/myapp.php?foo=1&bar=2"
DOC_PARAMS = {"CallSid": "CA1234567890ABCDE", "Caller": "+12349013030", "Digits": "1234",
              "From": "+12349013030", "To": "+18005551212"}
DOC_TOKEN = "12345"
DOC_SIGNATURE = "0/KCTR6DLpKmkAf8muzZqo1nDgQ="


def test_the_documented_example() -> None:
    assert sign(DOC_URL, DOC_PARAMS, DOC_TOKEN) == DOC_SIGNATURE  # the test's own signer agrees
    assert twilio_signature(DOC_TOKEN, DOC_URL, DOC_PARAMS.items()) == DOC_SIGNATURE
    # parameter order as received does not matter: Twilio sorts by name
    assert signature_matches(DOC_TOKEN, DOC_SIGNATURE, DOC_URL, reversed(DOC_PARAMS.items()))


def test_the_default_port_may_be_spelled_or_not() -> None:
    with_port = "https://mycompany.com:443/myapp.php?foo=1&bar=2"
    assert signature_matches(DOC_TOKEN, DOC_SIGNATURE, with_port, DOC_PARAMS.items())
    # the media stream's wss:// URL, both ways round
    bare, ported = "wss://bot.example/twilio/media", "wss://bot.example:443/twilio/media"
    assert signature_matches(DOC_TOKEN, sign(ported, None, DOC_TOKEN), bare)
    assert signature_matches(DOC_TOKEN, sign(bare, None, DOC_TOKEN), ported)
    # another port is another URL
    assert not signature_matches(DOC_TOKEN, DOC_SIGNATURE,
                                 "https://mycompany.com:8443/myapp.php?foo=1&bar=2",
                                 DOC_PARAMS.items())


def test_what_does_not_pass() -> None:
    items = DOC_PARAMS.items()
    assert not signature_matches(DOC_TOKEN, "", DOC_URL, items)
    assert not signature_matches("", DOC_SIGNATURE, DOC_URL, items)
    assert not signature_matches("54321", DOC_SIGNATURE, DOC_URL, items)
    assert not signature_matches(DOC_TOKEN, DOC_SIGNATURE, DOC_URL,
                                 {**DOC_PARAMS, "To": "+1"}.items())
    assert not signature_matches(DOC_TOKEN, DOC_SIGNATURE, DOC_URL,
                                 {**DOC_PARAMS, "Extra": ""}.items())
    assert not signature_matches(DOC_TOKEN, DOC_SIGNATURE, DOC_URL.replace("foo=1", "foo=2"),
                                 items)
    assert not signature_matches(DOC_TOKEN, DOC_SIGNATURE, "http://mycompany.com/myapp.php?foo=1"
                                 "&bar=2", items)
    assert not signature_matches(DOC_TOKEN, DOC_SIGNATURE[:-2] + "A=", DOC_URL, items)

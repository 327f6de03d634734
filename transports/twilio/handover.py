"""Handing a Twilio call over after its stream, without REST credentials, sans-I/O.

The TwiML our webhook answers has a ``<Redirect>`` after its ``<Connect>``: when we close the
stream Twilio requests that URL (the action endpoint) for what the call does next. A transfer
records the ``<Dial>`` for its CallSid, then closes the stream; the action endpoint answers the
recorded ``<Dial>``, and ``<Hangup/>`` for any other call (an agent hang-up ends the call as it
did before). Only a call whose TwiML this server gave out (its webhook saw the CallSid) can be
handed over this way: a stream connected by other TwiML (a TwiML Bin, a load balancer's
ingress) has no ``<Redirect>``, and closing it would end the call, so the book says so first.
"""

from __future__ import annotations

from collections import OrderedDict

from transports.admission import Admission, CallRequest, Refusal
from transports.twilio.signature import SIGNATURE_HEADER, signature_matches
from transports.twilio.twiml import hangup_twiml

# a stream starts within seconds of its TwiML; a recorded <Dial> is fetched within seconds of
# the stream's close (Twilio retries a failed fetch for a little while)
ARM_KEEP_S = 120.0
DIAL_KEEP_S = 300.0
MOST_CALLS = 10_000  # entries of each kind at most: ~100 bytes each, a megabyte in all
_Table = OrderedDict[str, tuple[float, str]]


class TransferBook:
    """Which calls may be handed over after their stream (*armed*: their TwiML came from here),
    and the ``<Dial>`` recorded for each call being handed over. Entries expire (``arm_keep_s``,
    ``dial_keep_s``) and at most ``most`` of each are kept, the oldest dropped first, so a
    server that runs for months holds only its last few minutes of calls."""

    def __init__(self, arm_keep_s: float = ARM_KEEP_S, dial_keep_s: float = DIAL_KEEP_S,
                 most: int = MOST_CALLS) -> None:
        self.arm_keep_s, self.dial_keep_s, self.most = arm_keep_s, dial_keep_s, most
        # CallSid -> (expiry, TwiML): an arm has no TwiML; in insertion order, which is the
        # order of expiry, since every entry of a table lives as long
        self._armed: OrderedDict[str, tuple[float, str]] = OrderedDict()
        self._dials: OrderedDict[str, tuple[float, str]] = OrderedDict()
        self.answered_dials = 0

    def __len__(self) -> int:
        return len(self._armed) + len(self._dials)

    def arm(self, call_sid: str, now: float) -> None:
        """The webhook gave ``call_sid`` TwiML with the ``<Redirect>`` to the action endpoint."""
        if call_sid:
            self._put(self._armed, call_sid, (now + self.arm_keep_s, ""), now)

    def claim(self, call_sid: str, now: float) -> bool:
        """The stream of ``call_sid`` started: whether its TwiML was ours (the arm is used up;
        the stream's control keeps the answer for the rest of the call)."""
        self._expire(self._armed, now)
        return bool(call_sid) and self._armed.pop(call_sid, None) is not None

    def record(self, call_sid: str, twiml: str, now: float) -> None:
        """Answer Twilio's action request for ``call_sid`` with ``twiml``."""
        self._put(self._dials, call_sid, (now + self.dial_keep_s, twiml), now)

    def answer(self, call_sid: str, now: float) -> str:
        """The TwiML for Twilio's action request: the recorded ``<Dial>``, else ``<Hangup/>``.
        It stays until it expires, so a retried request gets the same answer."""
        self._expire(self._dials, now)
        entry = self._dials.get(call_sid) if call_sid else None
        if entry is None:
            return hangup_twiml()
        self.answered_dials += 1
        return entry[1]

    def _put(self, table: _Table, key: str, value: tuple[float, str], now: float) -> None:
        table.pop(key, None)
        table[key] = value
        self._expire(table, now)
        while len(table) > self.most:
            table.popitem(last=False)

    @staticmethod
    def _expire(table: _Table, now: float) -> None:
        while table and next(iter(table.values()))[0] <= now:
            table.popitem(last=False)


def check_action_request(admission: Admission, request: CallRequest) -> Refusal | None:
    """Twilio's signature on the action request, checked as the webhook's is (the URL Twilio
    called, query string included, plus the POST parameters). Unlike a new call it is never
    turned away for want of room or while draining: it belongs to a call already served."""
    if admission.twilio_auth_token:
        url, params = admission.signed_url(request)
        signature = request.headers.get(SIGNATURE_HEADER, "")
        if signature_matches(admission.twilio_auth_token, signature, url, params):
            return None
        why = (f"this request has no valid X-Twilio-Signature (checked: {url}); the action "
               "endpoint answers only Twilio, signed with the account's auth token\n")
    elif admission.exposed:
        why = "Twilio's requests from outside this host need --twilio-auth-token on the server\n"
    else:
        return None  # loopback without a public URL: local tests
    admission.refused["signature"] += 1
    return Refusal(403, "signature", why)

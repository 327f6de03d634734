"""The one admission policy every call passes, whatever its path (browser WebSocket, WebRTC offer,
Twilio's TwiML webhook and media stream): who may call (the token off loopback, Twilio's
signature) and how many at once. Sans-I/O: a server hands in what a request says and turns a
refusal into its HTTP answer; refusals are counted here, in one place.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import parse_qsl

from agent.errors import ConfigError
from transports.auth import TokenAuth, is_loopback
from transports.twilio.signature import SIGNATURE_HEADER, signature_matches

TWILIO_TOKEN_HELP = "--twilio-auth-token or $TWILIO_AUTH_TOKEN"


class Route(enum.Enum):
    """What a request asks for, which decides the checks it gets."""

    BROWSER = "browser"  # GET /ws, POST /offer: a call; the shared token off loopback
    TWILIO_WEBHOOK = "twilio_webhook"  # the TwiML: Twilio's signature; holds no place itself
    TWILIO_MEDIA = "twilio_media"  # the media-stream WebSocket: Twilio's signature; a call

    @property
    def is_twilio(self) -> bool:
        return self is not Route.BROWSER

    @property
    def holds_place(self) -> bool:
        """The TwiML only points Twilio at the stream: the call, and its place, is the stream."""
        return self is not Route.TWILIO_WEBHOOK


@dataclass(slots=True, frozen=True)
class CallRequest:
    """What admission needs of a request, read off it by the server shell."""

    route: Route
    target: str  # path and query string exactly as sent ("/twilio/twiml?CallSid=CA1"), undecoded
    headers: Mapping[str, str]  # case-insensitive, as both aiohttp and websockets give them
    query: Mapping[str, str]
    form: tuple[tuple[str, str], ...] = ()  # the POST parameters of a form-encoded body
    scheme: str = "http"  # "http" or "https" as this server saw it (used without a public URL)


@dataclass(slots=True, frozen=True)
class Refusal:
    status: int  # 401 no token, 403 no valid Twilio signature, 503 at the call limit
    reason: str  # "token" | "signature" | "limit": the key it is counted under
    text: str  # the body: what went wrong and what to do

    @property
    def busy(self) -> bool:
        """Refused only for want of room: Twilio's webhook answers a busy tone rather than an
        error (the caller hears busy, not Twilio's "application error")."""
        return self.reason == "limit"


class Ticket:
    """A call's place within ``max_calls``. ``release`` gives it back; a second release is a
    no-op, so every exit path of a call may release without bookkeeping."""

    __slots__ = ("_admission", "held")

    def __init__(self, admission: Admission | None) -> None:
        self._admission = admission
        self.held = admission is not None

    def release(self) -> None:
        if self.held and self._admission is not None:
            self.held = False
            self._admission.active -= 1


class Admission:
    """The policy of one server (one port), shared by every route it serves.

    A server is *exposed* when it is bound to anything but loopback, or when it has a public URL
    (a tunnel or a reverse proxy makes a loopback-bound server reachable from anywhere). Exposed,
    browser calls need ``token`` (a random one is made when none is given); Twilio's routes need
    ``twilio_auth_token``, because Twilio cannot present our token on a media stream (a Stream URL
    takes no query string) and its signature is what shows a request is Twilio's. When a Twilio
    auth token is given, Twilio's routes check the signature on loopback too.

    ``max_calls`` bounds the calls held at once over all routes (each holds an ASR slot and a
    pipeline); a call beyond it is refused, never queued.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        token: str = "",
        max_calls: int = 64,
        public_url: str = "",
        twilio_auth_token: str = "",
    ) -> None:
        if public_url and not public_url.startswith(("https://", "http://", "wss://", "ws://")):
            raise ConfigError(f"--public-url must be an https:// address such as "
                              f"https://bot.example.com, got {public_url!r}")
        self.public_url = public_url.rstrip("/")
        self.exposed = bool(public_url) or not is_loopback(host)
        self.auth = TokenAuth.for_host(host, token, public=bool(public_url))
        self.max_calls = max_calls
        self.twilio_auth_token = twilio_auth_token
        self.active = 0
        self.refused: dict[str, int] = {"token": 0, "signature": 0, "limit": 0}

    # --- configuration -------------------------------------------------------------------------
    def require_twilio(self) -> None:
        """Called where Twilio's routes are served: an exposed server without the account's auth
        token would let anyone start calls on them, so it does not start at all."""
        if self.exposed and not self.twilio_auth_token:
            where = f"behind --public-url {self.public_url}" if self.public_url else "off loopback"
            raise ConfigError(
                f"Twilio calls {where} need the account's auth token to check Twilio's request "
                f"signature: set {TWILIO_TOKEN_HELP} (the Twilio console shows it), or bind to "
                "127.0.0.1 without --public-url for local tests"
            )

    # --- decisions -----------------------------------------------------------------------------
    def admit(self, request: CallRequest) -> Ticket | Refusal:
        """Admit ``request`` or say why not. A call admitted on a route that holds a place takes
        one at once (no await between the check and the taking, so the limit is exact); the
        shell releases the ticket when the call ends."""
        refusal = self._authorise(request)
        if refusal is None and self.active >= self.max_calls:
            refusal = Refusal(
                503, "limit",
                f"the server is at its limit of {self.max_calls} calls; try again later\n",
            )
        if refusal is not None:
            self.refused[refusal.reason] += 1
            return refusal
        if not request.route.holds_place:
            return Ticket(None)
        self.active += 1
        return Ticket(self)

    @property
    def refused_total(self) -> int:
        return sum(self.refused.values())

    def _authorise(self, request: CallRequest) -> Refusal | None:
        if not request.route.is_twilio:
            if self.auth.allows(request.query, request.headers):
                return None
            return Refusal(401, "token", "a token is required: add ?token=… to the page URL "
                                         "(or send it in the X-Voxline-Token header)\n")
        if self.twilio_auth_token:
            url, params = self.signed_url(request)
            signature = request.headers.get(SIGNATURE_HEADER, "")
            if signature_matches(self.twilio_auth_token, signature, url, params):
                return None
            return Refusal(403, "signature", (
                "this request has no valid X-Twilio-Signature: calls here come from Twilio, "
                f"signed with the account's auth token ({TWILIO_TOKEN_HELP}); behind a proxy or "
                f"a tunnel, --public-url must be the address Twilio calls (checked: {url})\n"))
        if self.exposed:  # require_twilio() stops this at start-up; never serve it open
            return Refusal(403, "signature", (
                f"Twilio calls from outside this host need {TWILIO_TOKEN_HELP} on the server\n"))
        return None

    # --- URLs ----------------------------------------------------------------------------------
    def public_base(self, scheme: str, host: str, websocket: bool) -> str:
        """``scheme://host`` Twilio reaches this server at: the public URL when there is one (a
        proxy's Host is not what Twilio called), else what this request says; ``ws``/``wss``
        for a WebSocket, ``http``/``https`` otherwise."""
        base = self.public_url or f"{scheme}://{host}"
        head, sep, rest = base.partition("://")
        secure = "s" if head in ("https", "wss") else ""
        return f"{'ws' if websocket else 'http'}{secure}{sep}{rest}"

    def signed_url(self, request: CallRequest) -> tuple[str, list[tuple[str, str]]]:
        """The URL and parameters Twilio signed for ``request``.

        A webhook is signed over its full URL, query string included as sent, plus its POST
        parameters. The media-stream upgrade is signed over its ``wss://`` URL, with any query
        parameters taken as parameters (what Twilio's own server library does; the TwiML never
        puts a query on the Stream URL, since Twilio does not support one).
        """
        websocket = request.route is Route.TWILIO_MEDIA
        base = self.public_base(request.scheme, request.headers.get("Host", ""), websocket)
        if not websocket:
            return base + request.target, list(request.form)
        path, _, query = request.target.partition("?")
        return base + path, parse_qsl(query, keep_blank_values=True)

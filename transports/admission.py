"""The one admission policy every call passes, whatever its path (browser WebSocket, WebRTC offer,
Twilio's TwiML webhook and media stream): who may call (the token off loopback, Twilio's
signature), from which page (the browser's ``Origin``, the ``Host`` it asked for) and how many at
once (over all, and per client address). Sans-I/O: a server hands in what a request says and
turns a refusal into its HTTP answer; refusals are counted here, in one place.

Why the page checks: a browser lets any web site open a WebSocket or post a CORS-simple request
to any address, this host's loopback included, with the visitor's cookies and network position
(cross-site WebSocket hijacking). Its ``Origin`` says which site did; a foreign one is refused.
DNS rebinding defeats that check (the attacker's name is made to resolve to 127.0.0.1, so the
page is "same-origin"), but then the ``Host`` the browser sends is the attacker's name, not one
of this server's: a server reachable only from this host answers only to loopback names.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

from agent.errors import ConfigError
from agent.netaddr import host_name, is_loopback, is_loopback_name
from transports.auth import TokenAuth
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
    peer: str = ""  # the client's address as the socket gives it ("" when unknown)


@dataclass(slots=True, frozen=True)
class Refusal:
    status: int  # 401 no token; 403 bad signature, Origin or Host; 503/429 at a limit
    reason: str  # a key of REFUSAL_REASONS: what it is counted under
    text: str  # the body: what went wrong and what to do

    @property
    def busy(self) -> bool:
        """Refused only for want of room: Twilio's webhook answers a busy tone rather than an
        error (the caller hears busy, not Twilio's "application error")."""
        return self.reason in ("limit", "draining")


REFUSAL_REASONS = ("token", "signature", "origin", "host", "limit", "client_limit", "draining")
DRAINING_TEXT = ("the server is shutting down: it is finishing its live calls and takes no new "
                 "ones; call again shortly (another server may answer)\n")


class Ticket:
    """A call's place within ``max_calls`` (and its client's within ``max_calls_per_client``).
    ``release`` gives it back; a second release is a no-op, so every exit path of a call may
    release without bookkeeping."""

    __slots__ = ("_admission", "held", "client")

    def __init__(self, admission: Admission | None, client: str = "") -> None:
        self._admission = admission
        self.held = admission is not None
        self.client = client  # the address counted against the per-client limit, "" if none

    def release(self) -> None:
        if self.held and self._admission is not None:
            self.held = False
            self._admission._release(self)



class Admission:
    """The policy of one server (one port), shared by every route it serves.

    A server is *exposed* when it is bound to anything but loopback, or when it has a public URL
    (a tunnel or a reverse proxy makes a loopback-bound server reachable from anywhere). Exposed,
    browser calls need ``token`` (a random one is made when none is given); Twilio's routes need
    ``twilio_auth_token``, because Twilio cannot present our token on a media stream (a Stream URL
    takes no query string) and its signature is what shows a request is Twilio's. When a Twilio
    auth token is given, Twilio's routes check the signature on loopback too.

    ``max_calls`` bounds the calls held at once over all routes (each holds an ASR slot and a
    pipeline); a call beyond it is refused, never queued. ``max_calls_per_client`` bounds the
    browser calls one client address holds (0: no bound); loopback clients are not counted,
    since behind a reverse proxy on this host every call comes from loopback, and Twilio's
    routes are not (every call comes from Twilio's few addresses, signed).

    Browser routes check the page: an ``Origin`` header (browsers send one on every WebSocket
    and cross-site POST; other clients need not) must be this server's own (the ``Host`` asked
    for), the public URL's, or one of ``allowed_origins`` (``"*"``: any). A server that is not
    exposed answers only to a ``Host`` that names loopback (``localhost``, ``127.0.0.1``,
    ``[::1]``) or one of ``allowed_hosts``; behind a public URL its host is allowed as well.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        token: str = "",
        max_calls: int = 64,
        public_url: str = "",
        twilio_auth_token: str = "",
        max_calls_per_client: int = 8,
        allowed_origins: Iterable[str] = (),
        allowed_hosts: Iterable[str] = (),
    ) -> None:
        if public_url and not public_url.startswith(("https://", "http://", "wss://", "ws://")):
            raise ConfigError(f"--public-url must be an https:// address such as "
                              f"https://bot.example.com, got {public_url!r}")
        self.public_url = public_url.rstrip("/")
        self.exposed = bool(public_url) or not is_loopback(host)
        self.auth = TokenAuth.for_host(host, token, public=bool(public_url))
        self.max_calls = max_calls
        self.max_calls_per_client = max_calls_per_client
        self.twilio_auth_token = twilio_auth_token
        self.allowed_origins = frozenset(o.rstrip("/").lower() for o in allowed_origins)
        self.allowed_hosts = frozenset(h.lower() for h in allowed_hosts)
        if public_url:  # the page is served from it: its origin and host are ours
            parts = urlsplit(public_url.lower())
            scheme = {"wss": "https", "ws": "http"}.get(parts.scheme, parts.scheme)
            self.allowed_origins |= {f"{scheme}://{parts.netloc}"}
            self.allowed_hosts |= {host_name(parts.netloc)}
        self.active = 0
        self.per_client: Counter[str] = Counter()
        self.refused: dict[str, int] = dict.fromkeys(REFUSAL_REASONS, 0)
        self.draining = False  # shutting down: every new call is refused (503, "draining")

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
        refusal = self._check_page(request) or self._authorise(request)
        client = self._counted_client(request)
        if refusal is None and self.draining:
            refusal = Refusal(503, "draining", DRAINING_TEXT)
        if refusal is None and self.active >= self.max_calls:
            refusal = Refusal(
                503, "limit",
                f"the server is at its limit of {self.max_calls} calls; try again later\n",
            )
        if refusal is None and client and self.per_client[client] >= self.max_calls_per_client:
            refusal = Refusal(
                429, "client_limit",
                f"this address already holds {self.max_calls_per_client} calls, the most one "
                "client may; end one first\n",
            )
        if refusal is not None:
            self.refused[refusal.reason] += 1
            return refusal
        if not request.route.holds_place:
            return Ticket(None)
        self.active += 1
        if client:
            self.per_client[client] += 1
        return Ticket(self, client)

    def _release(self, ticket: Ticket) -> None:
        self.active -= 1
        if ticket.client:
            self.per_client[ticket.client] -= 1
            if self.per_client[ticket.client] <= 0:
                del self.per_client[ticket.client]

    def _counted_client(self, request: CallRequest) -> str:
        if (request.route.is_twilio or not self.max_calls_per_client or not request.peer
                or is_loopback(request.peer)):
            return ""
        return request.peer

    @property
    def refused_total(self) -> int:
        return sum(self.refused.values())

    def _check_page(self, request: CallRequest) -> Refusal | None:
        """The browser routes' ``Host`` and ``Origin`` (see the class's docstring)."""
        if request.route.is_twilio:
            return None
        host = request.headers.get("Host", "")
        name = host_name(host)
        if host and not self.exposed and "*" not in self.allowed_hosts and not (
            is_loopback_name(name) or name in self.allowed_hosts
        ):
            return Refusal(403, "host", (
                f"this server answers only to its own names, not Host {host[:80]!r}; if that is "
                "one of its names, start it with --allow-host NAME\n"))
        origin = request.headers.get("Origin")
        if origin is None or "*" in self.allowed_origins:
            return None
        norm = origin.rstrip("/").lower()
        same = host and norm.partition("://")[2] == host.lower()
        if not (same or norm in self.allowed_origins):
            return Refusal(403, "origin", (
                f"calls from pages at {origin[:80]!r} are not allowed here; to allow that site, "
                "start the server with --allow-origin ORIGIN\n"))
        return None

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

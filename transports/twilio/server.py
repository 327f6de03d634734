"""The asyncio shell of Twilio Media Streams on ``websockets``: ``handle_media_stream`` serves one
WebSocket (mountable in any server that gives a websockets-style connection), and
``TwilioServer`` runs it standalone, with the TwiML endpoint and the action endpoint (what a
call does after its stream: a transfer's ``<Dial>``) on the same port (HTTP GET), all behind one
admission (Twilio's signature, a call limit).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import parse_qsl

from agent.errors import CapacityError
from agent.ops import Check, Health, OpsEndpoints, Sample
from agent.session import Session
from transports.admission import Admission, CallRequest, Refusal, Route, Ticket
from transports.lifecycle import CallLifecycle
from transports.twilio.call import TwilioCall, TwilioCallStats
from transports.twilio.control import TRANSFERRED, TwilioCallControl
from transports.twilio.handover import TransferBook, check_action_request
from transports.twilio.messages import Start, Stop, TwilioMessageError, parse_message
from transports.twilio.rest import DEFAULT_API_BASE, TwilioRest
from transports.twilio.twiml import connect_stream_twiml, reject_twiml

REPORTS_KEPT = 100  # end records a server keeps in memory (its on_end callback sees all)
log = logging.getLogger("voxline.twilio")
SessionFactory = Callable[[Start], Session | Awaitable[Session]]
START_TIMEOUT_S = 10.0  # Twilio sends connected and start at once; anything slower is not Twilio
# Twilio sends a media message every 20 ms for the whole call: a stream silent this long is dead
IDLE_TIMEOUT_S = 30.0
# an agent hang-up waits at most this long for Twilio to echo the marks of the audio it holds
PLAYED_OUT_WAIT_S = 3.0


class MessageSocket(Protocol):
    """What ``handle_media_stream`` needs of a WebSocket (websockets' connection has it)."""

    async def recv(self) -> str | bytes: ...
    async def send(self, message: str) -> None: ...
    async def close(self, code: int = 1000, reason: str = "") -> None: ...


@dataclass(slots=True, frozen=True)
class TwilioCallReport:
    stream_sid: str
    call_sid: str
    # "stop" | "disconnected" | "transferred" | the agent's hang-up reason ("idle", "agent")
    reason: str
    stats: TwilioCallStats
    malformed: int
    heard_lags_ms: list[float]
    summary: dict[str, Any]
    turns: list[dict[str, Any]]


async def handle_media_stream(
    ws: MessageSocket,
    session_factory: SessionFactory,
    on_call: Callable[[TwilioCall], None] | None = None,
    heard_from_marks: bool = True,
    rest: TwilioRest | None = None,
    book: TransferBook | None = None,
) -> TwilioCallReport | None:
    """Serve one media stream until Twilio's ``stop``, the socket closes or the agent hangs up
    (the stream is closed normally once its last words have played); the session is closed on
    every path. Returns None when the peer never sent a ``start``.

    The session's ``control`` is a :class:`TwilioCallControl`: it transfers through Twilio's
    REST API with ``rest``, else through ``book`` when the call's TwiML came from our webhook.
    """
    malformed = 0

    async def next_message() -> Any:
        nonlocal malformed
        while True:
            raw = await ws.recv()
            try:
                return parse_message(raw)
            except TwilioMessageError as err:
                malformed += 1
                log.debug("dropped a malformed Twilio message: %s", err)

    try:
        start = None
        async with asyncio.timeout(START_TIMEOUT_S):
            while not isinstance(start, Start):
                start = await next_message()
                if isinstance(start, Stop):
                    return None
    except (TimeoutError, ConnectionError, _closed_errors()):
        return None
    if start.encoding != "audio/x-mulaw" or start.sample_rate != 8000 or start.channels != 1:
        log.warning("stream %s: unsupported media format %s/%d/%d (only audio/x-mulaw/8000/1)",
                    start.stream_sid, start.encoding, start.sample_rate, start.channels)
        return None
    made = session_factory(start)
    session = await made if inspect.isawaitable(made) else made
    life = CallLifecycle(session, reason="disconnected")
    try:
        call = TwilioCall(session, start, heard_from_marks)
        armed = book is not None and book.claim(start.call_sid, time.monotonic())
        control = TwilioCallControl(call, session, rest, book, armed)
        session.control = control
        if on_call is not None:
            on_call(call)
    except BaseException:
        await life.close("error")
        raise
    async with life:  # a start that fails closes the session, and the error goes on
        loop = asyncio.get_running_loop()
        writer = loop.create_task(_write(ws, call))
        hangup = loop.create_task(_hang_up(ws, call, life))
        try:
            while not call.stopped:
                async with asyncio.timeout(IDLE_TIMEOUT_S):
                    msg = await next_message()
                call.receive(msg, time.monotonic_ns())
            await control.settled()  # (Twilio's stop may overtake its answer to our update)
            if control.transferred:  # Twilio ended the stream to run the transfer's <Dial>
                life.reason = TRANSFERRED
            elif not call.hanging_up:
                life.reason = "hangup"
        except TimeoutError:
            life.reason = "idle"
            log.warning("stream %s: nothing received for %g s, closing it", call.stream_sid,
                        IDLE_TIMEOUT_S)
            await ws.close(1011, "no media")
        except (ConnectionError, _closed_errors()):
            pass
        finally:
            for task in (writer, hangup):
                task.cancel()
            await asyncio.gather(writer, hangup, return_exceptions=True)
    reason = "stop" if life.reason == "hangup" else life.reason
    return TwilioCallReport(call.stream_sid, call.call_sid, reason, call.stats, malformed,
                            call.heard_lags_ms, session.summary, list(session.trace.turns))


async def _write(ws: MessageSocket, call: TwilioCall) -> None:
    """The pacer's schedule onto the socket: sleep until a packet time is due, send its
    messages (a late wake-up is caught up, a stall resynced, by the call's pacer)."""
    while True:
        for msg in call.tick(time.monotonic_ns()):
            await ws.send(msg.to_json())
        await asyncio.sleep(call.delay(time.monotonic_ns()))


async def _hang_up(ws: MessageSocket, call: TwilioCall, life: CallLifecycle) -> None:
    """The agent ends the call: once Twilio has played what was sent (its marks are back, or
    ``PLAYED_OUT_WAIT_S`` passed), close the stream normally with the reason."""
    call.hang_up(await life.agent_hangup())
    loop = asyncio.get_running_loop()
    give_up = loop.time() + PLAYED_OUT_WAIT_S
    while not call.played_out and loop.time() < give_up:
        await asyncio.sleep(call.pacer.ptime_ns / 1e9)
    await ws.close(1000, call.hanging_up)


def _closed_errors() -> type[Exception]:
    from websockets.exceptions import ConnectionClosed

    return ConnectionClosed


class TwilioServer:
    """Standalone server: WebSocket media streams on ``media_path``, and TwiML on
    ``GET twiml_path`` pointing Twilio at ``public_url`` + ``media_path`` (``wss://…``).

    Both go through one :class:`~transports.admission.Admission`: Twilio's signature is checked
    when ``twilio_auth_token`` is given (and must be, unless the server is on loopback without a
    public URL), and at most ``max_calls`` streams run at once (the TwiML answers busy beyond it,
    a media stream gets 503).

    Transfers: with ``twilio_account_sid`` (and the auth token) through Twilio's REST API at
    ``twilio_api_base``; without, the TwiML gets a ``<Redirect>`` to ``GET action_path``, which
    answers a transferred call's ``<Dial>`` once its stream has closed (signed like the
    webhook; never refused for want of room: the call is already ours)."""

    def __init__(
        self,
        session_factory: SessionFactory,
        host: str = "127.0.0.1",
        port: int = 8080,
        public_url: str = "",
        media_path: str = "/twilio/media",
        twiml_path: str = "/twilio/twiml",
        on_call: Callable[[TwilioCall], None] | None = None,
        on_end: Callable[[TwilioCallReport], None] | None = None,
        twilio_auth_token: str = "",
        max_calls: int = 100,
        ready_checks: tuple[Check, ...] = (),
        twilio_account_sid: str = "",
        twilio_api_base: str = DEFAULT_API_BASE,
        action_path: str = "/twilio/action",
    ) -> None:
        self.session_factory = session_factory
        self.host, self.port = host, port
        self.media_path, self.twiml_path, self.action_path = media_path, twiml_path, action_path
        self.on_call, self.on_end = on_call, on_end
        self.admission = Admission(host, max_calls=max_calls, public_url=public_url,
                                   twilio_auth_token=twilio_auth_token)
        self.admission.require_twilio()  # fail at start-up, not on the first call
        self.rest = (TwilioRest(twilio_account_sid, twilio_auth_token, twilio_api_base)
                     if twilio_account_sid else None)
        self.transfers = TransferBook()  # used when there is no REST client
        # the last REPORTS_KEPT calls' end records (a server runs for months: all of them
        # would grow without bound); ``ended`` counts every call
        self.reports: deque[TwilioCallReport] = deque(maxlen=REPORTS_KEPT)
        self.ended = 0
        self.media_dropped = 0  # caller media over the real-time rate, of the ended calls
        self._server: Any = None
        self._tickets: dict[Any, Ticket] = {}  # connection -> its place, from upgrade to close
        self._watchers: set[asyncio.Task[None]] = set()
        # /healthz, /readyz and /metrics (the command sets ops.metrics) on the same port
        self.health = Health(self.stats, [self._room, *ready_checks], loaded=True)
        self.ops = OpsEndpoints(self.health)

    def stats(self) -> dict[str, Any]:
        return {"calls": self.active, "ended": self.ended,
                "refused_by": dict(self.admission.refused)}

    def metric_samples(self) -> list[Sample]:
        refused = "Calls refused at admission, by reason."
        return [
            Sample("voxline_calls_admitted", "gauge", "Media streams holding a place.",
                   self.active),
            Sample("voxline_calls_max", "gauge", "Media streams served at once (--max-calls).",
                   self.admission.max_calls),
            Sample("voxline_draining", "gauge", "1 while the server drains (SIGTERM).",
                   int(self.admission.draining)),
            *(Sample("voxline_calls_refused", "counter", refused, n, (("reason", reason),))
              for reason, n in self.admission.refused.items()),
            Sample("voxline_frames_dropped", "counter", "Audio frames dropped, by transport and "
                   "direction (in: caller media over the real-time rate; counted as calls end).",
                   self.media_dropped, (("transport", "twilio"), ("direction", "in"))),
        ]

    def _room(self) -> str:
        most = self.admission.max_calls
        return "" if self.active < most else f"at its limit of {most} calls"

    def begin_drain(self) -> None:
        """Take no new call (the TwiML answers busy, a media stream 503); live ones go on."""
        self.admission.draining = self.health.draining = True

    @property
    def live_calls(self) -> int:
        return self.active

    @property
    def active(self) -> int:
        """Media streams holding a place now."""
        return self.admission.active

    def stream_url(self, host_header: str = "") -> str:
        host = host_header or f"{self.host}:{self.port}"
        return self.admission.public_base("http", host, websocket=True) + self.media_path

    async def start(self) -> tuple[str, int]:
        from agent.errors import require

        require("websockets", what="the Twilio media-stream server", extra="web")
        from websockets.asyncio.server import serve

        self._server = await serve(self._handler, self.host, self.port,
                                   process_request=self._http, max_size=2**16)
        sock = next(iter(self._server.sockets))
        self.host, self.port = sock.getsockname()[:2]
        return self.host, self.port

    def _http(self, connection: Any, request: Any) -> Any:
        path, _, query = request.path.partition("?")
        if path == self.action_path:
            return self._action(connection, request, query)
        if path == self.twiml_path:
            route = Route.TWILIO_WEBHOOK
        elif path == self.media_path:
            route = Route.TWILIO_MEDIA
        elif (ops := self.ops.respond(path)) is not None:
            status, kind, body = ops
            return _typed(connection.respond(status, body.decode()), kind)
        else:
            return connection.respond(404, "not found\n")
        decision = self.admission.admit(CallRequest(
            route, request.path, request.headers, dict(parse_qsl(query, keep_blank_values=True)),
        ))
        if isinstance(decision, Refusal):
            if route is Route.TWILIO_WEBHOOK and decision.busy:
                return self._xml(connection, reject_twiml("busy"))
            return connection.respond(decision.status, decision.text)
        if route is Route.TWILIO_WEBHOOK:
            host = request.headers.get("Host", "")
            then = ""
            if self.rest is None:  # transfers go through the action endpoint after the stream
                self.transfers.arm(dict(parse_qsl(query)).get("CallSid", ""), time.monotonic())
                then = self.admission.public_base("http", host, websocket=False) + self.action_path
            return self._xml(connection, connect_stream_twiml(
                self.stream_url(host), then_url=then, then_method="GET"))
        self._hold(connection, decision)
        return None  # the media WebSocket

    def _action(self, connection: Any, request: Any, query: str) -> Any:
        """Twilio asks what the call does now that its stream has ended (GET: the call's
        parameters in the query string)."""
        params = dict(parse_qsl(query, keep_blank_values=True))
        refusal = check_action_request(self.admission, CallRequest(
            Route.TWILIO_WEBHOOK, request.path, request.headers, params))
        if refusal is not None:
            return connection.respond(refusal.status, refusal.text)
        return self._xml(connection, self.transfers.answer(params.get("CallSid", ""),
                                                           time.monotonic()))

    @staticmethod
    def _xml(connection: Any, body: str) -> Any:
        return _typed(connection.respond(200, body), "text/xml")

    def _hold(self, connection: Any, ticket: Ticket) -> None:
        """Keep the place until the connection closes, whether or not its handshake completes
        (a failed upgrade never reaches ``_handler``, and must not keep a place for good)."""
        self._tickets[connection] = ticket

        async def release_on_close() -> None:
            try:
                await connection.wait_closed()
            finally:
                self._tickets.pop(connection, None)
                ticket.release()

        watcher = asyncio.get_running_loop().create_task(release_on_close())
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)

    async def _handler(self, ws: Any) -> None:
        ticket = self._tickets.pop(ws, None)
        try:
            report = await handle_media_stream(ws, self.session_factory, self.on_call,
                                               rest=self.rest, book=self.transfers)
        except CapacityError as exc:  # refused for want of room: a line, not a traceback
            log.warning("Twilio media stream refused: %s", exc)
            return
        except Exception:
            log.exception("Twilio media stream failed")
            return
        finally:
            if ticket is not None:
                ticket.release()  # at once, not when the close handshake is over
        if report is not None:
            self.reports.append(report)
            self.ended += 1
            self.media_dropped += report.stats.media_dropped
            if self.on_end is not None:
                self.on_end(report)

    async def stop(self) -> None:
        self.begin_drain()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for watcher in list(self._watchers):
            watcher.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)


def _typed(response: Any, content_type: str) -> Any:
    """``response`` with ``content_type`` as its only Content-Type (websockets' ``respond``
    sets text/plain, and its headers' item assignment adds a value beside it)."""
    del response.headers["Content-Type"]
    response.headers["Content-Type"] = content_type
    return response

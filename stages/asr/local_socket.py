"""Where asr-serve's Unix socket lives and who may use it: by default a directory only this user
can enter, the socket file ``0600`` (``0660`` with a configured group), and each end checking the
credentials of the process at the other end (``SO_PEERCRED``) — so another user can neither take
the path first and collect a pipeline's audio, nor talk to the server."""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import socket
import stat
import struct
from dataclasses import dataclass

from agent.errors import ConfigError, VoxlineError

SOCKET_NAME = "asr.sock"
SERVER_USER_ENV = "VOXLINE_ASR_SERVER_USER"  # a client also trusts a server run by this user
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class SocketTrustError(VoxlineError):
    """The socket, its directory or the process serving it is not this user's."""


@dataclass(slots=True, frozen=True)
class Peer:
    """The process at the other end of a Unix socket, as the kernel saw it connect."""

    pid: int
    uid: int
    gid: int


def default_path() -> str:
    """``$XDG_RUNTIME_DIR/voxline/asr.sock`` when that runtime directory is this user's and
    private, else ``/tmp/voxline-<uid>/asr.sock`` (server and clients compute the same)."""
    uid = os.geteuid()
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(runtime):
        try:
            st = os.stat(runtime)
        except OSError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o077:
            return os.path.join(runtime, "voxline", SOCKET_NAME)
    return os.path.join("/tmp", f"voxline-{uid}", SOCKET_NAME)


def private_dir(path: str, group: int | None = None) -> None:
    """Make the directory of ``path`` (the default socket's) or check the one there: it must be
    this user's; its mode becomes ``0700`` (``0710`` and owned by ``group``, so the group may
    reach the socket but list and change nothing). One made by another user is refused: it
    would let them replace the socket."""
    where = os.path.dirname(path)
    with contextlib.suppress(FileExistsError):
        os.mkdir(where, 0o700)
    st = os.lstat(where)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise ConfigError(
            f"{where} is not a directory of yours (owner uid {st.st_uid}); someone may have made "
            "it to catch asr-serve's socket — remove it, or pass --socket PATH in a directory "
            "only you can write")
    if group is not None:
        os.chown(where, -1, group)
        os.chmod(where, 0o710)
    elif stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(where, 0o700)


def listen(path: str, group: int | None = None, backlog: int = 4096) -> socket.socket:
    """A non-blocking Unix socket listening at ``path``, mode ``0600`` (``0660`` and owned by
    ``group``) from the moment the file exists. A stale socket of this user's there is replaced;
    anything else there is refused with a message."""
    uid = os.geteuid()
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(st.st_mode):
            raise ConfigError(f"{path} exists and is not a socket — remove it or pass another --socket")
        if st.st_uid != uid:
            raise ConfigError(
                f"the socket {path} belongs to another user (uid {st.st_uid}): clients would "
                "reach their server, not this one — remove it, or pass --socket PATH in a "
                "directory only you can write")
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mode = 0o600 if group is None else 0o660
    old = os.umask(0o777 & ~mode)  # bind() creates the file: never a moment more open than mode
    try:
        sock.bind(path)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {path}: {exc.strerror or exc}") from None
    finally:
        os.umask(old)
    if group is not None:
        os.chown(path, -1, group)
    os.chmod(path, mode)
    sock.listen(backlog)
    sock.setblocking(False)
    return sock


def peer_of(sock: socket.socket) -> Peer | None:
    """The credentials of the process at the other end; None where the kernel gives none."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size)
    except (OSError, AttributeError):  # not Linux, or not a Unix socket
        return None
    return Peer(*_CRED.unpack(raw))


def group_id(name: str) -> int:
    """A group given by name or number (``--socket-group``)."""
    try:
        return int(name) if name.isascii() and name.isdigit() else grp.getgrnam(name).gr_gid
    except KeyError:
        raise ConfigError(f"--socket-group: no group named {name!r} on this machine") from None


@dataclass(slots=True, frozen=True)
class PeerPolicy:
    """Who may connect to the server: its own user, root, and members of ``group`` if one is
    configured. Where the kernel gives no credentials, the socket file's mode is the guard."""

    uid: int
    group: int | None = None

    def allows(self, peer: Peer | None) -> bool:
        if peer is None or peer.uid in (self.uid, 0):
            return True
        if self.group is None:
            return False
        return peer.gid == self.group or self.group in _groups_of(peer)


def _groups_of(peer: Peer) -> set[int]:
    """The peer process's supplementary groups (``/proc``), else its user's in the group file."""
    with (contextlib.suppress(OSError, ValueError),
          open(f"/proc/{peer.pid}/status", encoding="ascii", errors="replace") as f):
        for line in f:
            if line.startswith("Groups:"):
                return {int(g) for g in line.split()[1:]}
    try:
        user = pwd.getpwuid(peer.uid).pw_name
    except KeyError:
        return set()
    return {g.gr_gid for g in grp.getgrall() if user in g.gr_mem}


# --- the client's side -------------------------------------------------------------------------


def trusted_uids() -> set[int]:
    """Whose asr-serve a client sends audio to: its own user's, root's, and the user named in
    ``$VOXLINE_ASR_SERVER_USER`` (a server run by another user, shared through a group)."""
    uids = {os.geteuid(), 0}
    who = os.environ.get(SERVER_USER_ENV, "").strip()
    if who:
        try:
            uids.add(int(who) if who.isascii() and who.isdigit() else pwd.getpwnam(who).pw_uid)
        except KeyError:
            raise SocketTrustError(f"${SERVER_USER_ENV} names no user on this machine: {who!r}") from None
    return uids


def check_socket_file(path: str, trusted: set[int]) -> None:
    """Before connecting: ``path`` is a socket of a trusted user, and the default socket's
    directory is this user's and writable by nobody else (else someone could swap the socket)."""
    try:
        st = os.lstat(path)
    except OSError:
        return  # nothing there: connect() says so
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketTrustError(f"{path} is not a socket")
    if st.st_uid not in trusted:
        raise SocketTrustError(
            f"the socket {path} belongs to another user (uid {st.st_uid}): refusing to send it "
            f"audio — if that is your asr-serve run by that user, set ${SERVER_USER_ENV}")
    if path == default_path():
        where = os.path.dirname(path)
        d = os.lstat(where)
        if d.st_uid != os.geteuid() or d.st_mode & 0o022 or not stat.S_ISDIR(d.st_mode):
            raise SocketTrustError(
                f"{where} is not a private directory of yours (owner uid {d.st_uid}, mode "
                f"{stat.S_IMODE(d.st_mode):o}): refusing its socket — remove the directory and "
                "restart asr-serve")


def check_server(sock: socket.socket, path: str, trusted: set[int]) -> None:
    """After connecting: the process serving ``path`` runs as a trusted user."""
    peer = peer_of(sock)
    if peer is not None and peer.uid not in trusted:
        raise SocketTrustError(
            f"the process serving {path} runs as another user (uid {peer.uid}): refusing to send "
            f"it audio — if that is your asr-serve run by that user, set ${SERVER_USER_ENV}")

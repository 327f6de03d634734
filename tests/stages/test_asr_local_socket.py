"""asr-serve's socket path and modes: the private default directory, a socket file never more
open than 0600 (0660 for a group), nothing of another user's taken over, and the peer policy."""

import os
import socket
import stat

import pytest

from agent.errors import ConfigError
from stages.asr import local_socket
from stages.asr.local_socket import Peer, PeerPolicy


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_the_default_path_is_per_user_and_private(tmp_path, monkeypatch):
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    assert local_socket.default_path() == f"/tmp/voxline-{os.geteuid()}/asr.sock"
    shared = tmp_path / "shared-runtime"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(shared))  # not private: not used
    assert local_socket.default_path().startswith("/tmp/voxline-")
    shared.chmod(0o700)
    assert local_socket.default_path() == str(shared / "voxline" / "asr.sock")


def test_the_private_directory_is_made_tightened_and_checked(tmp_path):
    path = str(tmp_path / "voxline" / "asr.sock")
    local_socket.private_dir(path)
    assert mode(tmp_path / "voxline") == 0o700
    (tmp_path / "voxline").chmod(0o777)  # ours, but too open: tightened
    local_socket.private_dir(path)
    assert mode(tmp_path / "voxline") == 0o700
    local_socket.private_dir(path, group=os.getgid())
    assert mode(tmp_path / "voxline") == 0o710
    assert os.stat(tmp_path / "voxline").st_gid == os.getgid()


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a directory of another user (needs root)")
def test_a_directory_another_user_made_is_refused(tmp_path):
    theirs = tmp_path / "voxline"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    with pytest.raises(ConfigError, match="is not a directory of yours"):
        local_socket.private_dir(str(theirs / "asr.sock"))


def test_the_socket_is_0600_whatever_the_umask_and_0660_for_a_group(tmp_path):
    old = os.umask(0)
    try:
        one = local_socket.listen(str(tmp_path / "a.sock"))
        two = local_socket.listen(str(tmp_path / "b.sock"), group=os.getgid())
    finally:
        os.umask(old)
    try:
        assert mode(tmp_path / "a.sock") == 0o600
        assert mode(tmp_path / "b.sock") == 0o660
        assert os.stat(tmp_path / "b.sock").st_gid == os.getgid()
    finally:
        one.close()
        two.close()


def test_a_stale_socket_of_ours_is_replaced_anything_else_refused(tmp_path):
    path = str(tmp_path / "asr.sock")
    local_socket.listen(path).close()  # a server that died: its socket file stays
    again = local_socket.listen(path)
    again.close()
    plain = tmp_path / "file"
    plain.write_text("not a socket")
    with pytest.raises(ConfigError, match="is not a socket"):
        local_socket.listen(str(plain))
    assert plain.read_text() == "not a socket"


def test_peer_credentials_and_the_policy(tmp_path):
    server = local_socket.listen(str(tmp_path / "p.sock"))
    client = socket.socket(socket.AF_UNIX)
    try:
        client.connect(str(tmp_path / "p.sock"))
        conn, _ = server.accept()
        peer = local_socket.peer_of(conn)
        assert peer == Peer(os.getpid(), os.geteuid(), os.getegid())
        assert local_socket.peer_of(client).pid == os.getpid()  # the server's, seen by the client
        conn.close()
    finally:
        client.close()
        server.close()
    me = PeerPolicy(uid=1000)
    assert me.allows(Peer(1, 1000, 1000)) and me.allows(Peer(1, 0, 0))
    assert not me.allows(Peer(1, 1001, 1001))
    grouped = PeerPolicy(uid=1000, group=4242)
    assert grouped.allows(Peer(1, 1001, 4242))  # its primary group
    assert not grouped.allows(Peer(os.getpid() + 10**6, 1001, 1001))  # no such process, no member

"""RemoteASRBackend declares its lanes: the engine in front of it keeps several calls to
asr-serve in flight instead of silently getting one (nothing here connects to a server)."""

from agent.config import ASRConfig
from stages.asr.backend import ASRBackend, BatchCost
from stages.asr.engine import ASREngine
from stages.asr.remote import DEFAULT_LANES, RemoteASRBackend


def test_declares_its_lanes_and_what_the_wire_carries():
    remote = RemoteASRBackend(ASRConfig(model="/nonexistent.sock"), max_batch=16)
    caps = remote.capabilities
    assert isinstance(remote, ASRBackend)
    assert caps.lanes == DEFAULT_LANES == 4 and caps.max_batch == remote.max_batch == 16
    assert caps.sample_rate == remote.sample_rate == 16000
    assert caps.batch_cost is BatchCost.LINEAR  # so a final never waits for partials
    assert not (caps.prompts or caps.word_times or caps.stateful)
    assert caps.sentence_ends and not remote.sentence_ends  # it can ask; nobody asked yet


def test_lanes_come_from_the_argument_then_the_configured_workers():
    assert RemoteASRBackend(ASRConfig(workers=3)).capabilities.lanes == 3
    assert RemoteASRBackend(ASRConfig(workers=3), lanes=6).capabilities.lanes == 6


def test_the_engine_runs_one_lane_per_declared_call_and_finals_alone():
    engine = ASREngine(RemoteASRBackend(ASRConfig(model="/nonexistent.sock")), capacity=2)
    try:
        assert engine.lanes == DEFAULT_LANES and engine.finals_alone
    finally:
        engine.close()


def test_without_a_socket_given_it_uses_the_private_default(monkeypatch, tmp_path):
    from stages.asr.local_socket import default_path

    monkeypatch.delenv("VOXLINE_ASR_SOCKET", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    tmp_path.chmod(0o700)
    assert RemoteASRBackend(ASRConfig()).path == default_path() == str(tmp_path / "voxline" / "asr.sock")
    monkeypatch.setenv("VOXLINE_ASR_SOCKET", "/elsewhere.sock")
    assert RemoteASRBackend(ASRConfig()).path == "/elsewhere.sock"
    assert RemoteASRBackend(ASRConfig(model="/given.sock")).path == "/given.sock"

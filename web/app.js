// voxline browser call: microphone → server (WebSocket PCM or WebRTC), agent audio back,
// live transcripts, agent replies, a per-turn latency waterfall and a barge-in indicator.
// Standard Web APIs only; no build step. `window.voxline` exposes the call's state to tests.

const $ = (id) => document.getElementById(id);
const MIC_CONSTRAINTS = { audio: { echoCancellation: true, noiseSuppression: true,
                                   autoGainControl: true, channelCount: 1 } };
const token = new URLSearchParams(location.search).get('token');
const withToken = (path) => (token ? `${path}?token=${encodeURIComponent(token)}` : path);
// Behind the scale-out ingress (voxline serve --ray) the page says where to ask for a place: the
// ingress reserves one on a replica and answers that replica's own addresses, so the call's
// media goes straight to it. Served by a voxline server itself, the page calls that server.
const placement = document.querySelector('meta[name=voxline-placement]')?.content;

async function mediaAddresses() {
  if (!placement) {
    const proto = location.protocol === 'https:' ? 'wss:' : 'ws:';
    return { ws: `${proto}//${location.host}${withToken('/ws')}`, offer: withToken('/offer') };
  }
  const r = await fetch(withToken(placement), { method: 'POST' });
  if (!r.ok) {
    let why = (await r.text()).trim();
    try { why = JSON.parse(why).why || why; } catch (e) { /* plain text */ }
    throw new Error(`no place for the call: ${r.status} ${why}`);
  }
  const place = await r.json();
  state.replica = place.replica;
  return place;
}

const state = window.voxline = {
  status: 'idle', transport: null, session: null, replica: null, events: 0, finals: [], partial: '',
  replies: [], traces: [], interrupts: 0, errors: [], micFrames: 0, agentChunks: 0,
  agentMaxRms: 0, micMaxRms: 0, voiceToVoiceMs: [], voiceToVoiceMsAt: [],
  // WebRTC only: the same turns timed where WebAudio's analyser hears the agent (see startWebRTC)
  voiceToVoiceWebAudioMs: [], voiceToVoiceWebAudioMsAt: [], rtp: null,
  micClock: 'analyser',  // where the caller's voice end is timed: 'capture' or 'analyser'
};

let call = null;  // the live call's handles, null when idle

// --- UI ------------------------------------------------------------------------------------------
function setStatus(s) {
  state.status = s;
  $('status').textContent = s;
  $('status').dataset.state = s;
  const live = s !== 'idle' && s !== 'ended' && s !== 'failed';
  $('call').textContent = live ? 'Hang up' : 'Call';
  $('call').classList.toggle('hangup', live);
  for (const r of document.querySelectorAll('input[name=transport]')) r.disabled = live;
}

function showError(msg) {
  state.errors.push(msg);
  $('error').textContent = msg;
}

function addLine(who, text, cls = '') {
  const li = document.createElement('li');
  li.className = `${who} ${cls}`.trim();
  li.innerHTML = `<span class="who">${who === 'caller' ? 'you' : 'agent'}</span>`;
  li.append(document.createTextNode(text));
  $('log').append(li);
  $('log').scrollTop = $('log').scrollHeight;
  return li;
}

let agentLine = null;  // the reply being streamed in
function agentText(text, done, cancelled = false) {
  if (!agentLine) agentLine = addLine('agent', '');
  agentLine.lastChild.textContent = text;
  if (done) {
    if (cancelled) agentLine.classList.add('cancelled');
    agentLine = null;
  }
}

function flash(id, ms) {
  const el = $(id);
  el.classList.add('on');
  clearTimeout(el._t);
  el._t = setTimeout(() => el.classList.remove('on'), ms);
}

function drawTurn(ev) {
  const spans = ev.spans || {};
  // every span the trace sent, in its order (agent/trace.py): the page keeps no list of its own
  const names = Object.keys(spans);
  if (!names.length) return;
  const total = spans.voice_to_voice || spans.greeting;
  const scale = Math.max(...names.map((n) => Math.max(spans[n].end_ms, spans[n].budget_ms || 0)), 1);
  const div = document.createElement('div');
  div.className = 'turn';
  div.dataset.turn = ev.turn;
  const label = ev.kind === 'greeting' ? 'greeting' : `turn ${ev.turn}`;
  const over = names.filter((n) => spans[n].over);
  div.innerHTML = `<div class="title">${label}: <b class="${over.length ? 'over' : ''}">${
    total ? Math.round(total.ms) + ' ms' : '—'}</b>${over.length ? ' — over budget: ' + over.join(', ') : ''}</div>`;
  for (const n of names) {
    const s = spans[n];
    const row = document.createElement('div');
    row.className = 'row' + (s.over ? ' over' : '');
    row.dataset.span = n;
    const left = (100 * Math.max(s.start_ms, 0)) / scale;
    const width = (100 * s.ms) / scale;
    const budget = s.budget_ms != null
      ? `<span class="budget" style="left:${(100 * (s.start_ms + s.budget_ms)) / scale}%"></span>` : '';
    row.innerHTML = `<span>${n.replaceAll('_', ' ')}</span><span class="track"><span class="bar" style="left:${left}%;width:${width}%"></span>${budget}</span><span class="ms">${Math.round(s.ms)} ms</span>`;
    div.append(row);
  }
  $('waterfall').prepend(div);
}

// --- events from the server ------------------------------------------------------------------
function onEvent(ev) {
  state.events++;
  switch (ev.type) {
    case 'ready': state.session = ev.session; setStatus('connected'); break;
    case 'transcript':
      if (ev.final) {
        $('partial').textContent = state.partial = '';
        if (ev.text.trim()) { state.finals.push(ev.text.trim()); addLine('caller', ev.text.trim()); }
      } else {
        $('partial').textContent = state.partial = ev.text;
      }
      break;
    case 'speech_started': $('you').classList.add('on'); break;
    case 'speech_stopped': $('you').classList.remove('on'); break;
    case 'agent_delta': agentText(((agentLine && agentLine.lastChild.textContent) || '') + ev.text, false); break;
    case 'agent_text':
      agentText(ev.text, true, ev.cancelled);
      if (ev.text.trim()) state.replies.push({ text: ev.text, cancelled: ev.cancelled });
      break;
    case 'agent_say': if (ev.greeting) { addLine('agent', ev.text); state.replies.push({ text: ev.text, greeting: true }); } break;
    case 'bot_started': $('agent').classList.add('on'); break;
    case 'bot_stopped': $('agent').classList.remove('on'); break;
    case 'interrupt':
      state.interrupts++;
      $('barge-count').textContent = state.interrupts;
      flash('barge', 1500);
      if (call && call.flushPlayback) call.flushPlayback();
      break;
    case 'trace': state.traces.push(ev); drawTurn(ev); break;
    case 'error': showError(`${ev.stage || 'server'}: ${ev.message}`); break;
    default: break;
  }
}

// --- levels: the agent meter and the page-side voice-to-voice measurement --------------------------
// Voice-to-voice as the page hears it: from where the microphone's voice stopped (the last 5-ms
// block within 35 dB of the loudest the microphone has carried, as the server's VAD clocks it),
// timed at capture, to the first agent audio the page plays: over WebSocket where WebAudio plays
// it (an analyser holding more than one polling interval, so every 5-ms block is seen), over
// WebRTC where the receiver hands it to the playing element (to its 10-ms chunk).
const AGENT_AUDIBLE = 0.005;  // RMS of a 5-ms block (-46 dBFS)
const voiceLevel = () => Math.max(0.001, state.micMaxRms * 0.0178);  // -35 dB under the loudest

// The caller's voice end timed at capture: a copy of the microphone track read frame by frame
// (MediaStreamTrackProcessor; each AudioData is stamped when captured, on the page's clock in
// Chromium), 5-ms blocks against the 35-dB rule. Returns the copy (stop it on hang-up), or null
// where the browser lacks the API and the analyser must stand in.
function watchCapture(track, clocks) {
  if (typeof MediaStreamTrackProcessor === 'undefined') return null;
  const copy = track.clone();
  const reader = new MediaStreamTrackProcessor({ track: copy }).readable.getReader();
  state.micClock = 'capture';
  let buf = new Float32Array(0);
  (async () => {
    for (;;) {
      let r;
      try { r = await reader.read(); } catch { return; }
      if (r.done) return;
      const d = r.value;
      const n = d.numberOfFrames, rate = d.sampleRate;
      if (buf.length < n) buf = new Float32Array(n);
      d.copyTo(buf, { planeIndex: 0, format: 'f32-planar' });
      // a stamp off the page's clock (another browser's origin) falls back to the arrival time
      const now = performance.now();
      const stamped = d.timestamp / 1000;
      const t0 = Math.abs(now - stamped) < 1000 ? stamped : now - (1000 * n) / rate;
      d.close();
      const block = Math.round(rate * 0.005);
      for (let i = 0; i + block <= n; i += block) {
        let e = 0;
        for (let k = i; k < i + block; k++) e += buf[k] * buf[k];
        const rms = Math.sqrt(e / block);
        state.micMaxRms = Math.max(state.micMaxRms, rms);
        if (rms >= voiceLevel()) for (const c of clocks) c.voice(t0 + (1000 * (i + block)) / rate);
      }
    }
  })();
  return copy;
}

// Pairs the caller's voice end with the start of the agent audio that follows it. `into` names
// the state arrays the turn lands in (ms, and both ends on the wall clock so a server on this
// machine can split the time).
function turnClock(into) {
  let lastVoice = 0, agentOn = false, agentQuietSince = 0;
  return {
    voice(t) { lastVoice = Math.max(lastVoice, t); },
    agent(audible, start, now) {
      if (audible) {
        // the agent starting while the caller still speaks is not a voice-to-voice turn
        if (!agentOn && lastVoice && lastVoice > agentQuietSince && start - lastVoice >= 40) {
          state[into].push(Math.round(start - lastVoice));
          state[`${into}At`].push([performance.timeOrigin + lastVoice, performance.timeOrigin + start]);
        }
        agentOn = true; agentQuietSince = 0;
      } else if (agentOn) { agentOn = false; agentQuietSince = now; }
    },
  };
}

// The analysers: the agent meter, the agent's start for clocks that hear it in WebAudio, and —
// only where the browser cannot read the microphone's own frames (see watchCapture) — the
// caller's voice end, which WebAudio's analyser sees some 20-30 ms after capture.
function watchLevels(ctx, micSource, agentOut, voiceClocks, agentClocks) {
  const size = ctx.sampleRate > 24000 ? 2048 : 1024;
  let mic = null;
  if (voiceClocks.length) { mic = ctx.createAnalyser(); mic.fftSize = size; micSource.connect(mic); }
  const agent = ctx.createAnalyser(); agent.fftSize = size; agentOut.connect(agent);
  const buf = new Float32Array(size);
  const block = Math.round(ctx.sampleRate * 0.005);
  const blocks = Math.floor(size / block);
  const levels = new Float32Array(blocks);
  const msPerSample = 1000 / ctx.sampleRate;
  // RMS of each 5-ms block (the newest last); returns that of the newest 256 samples (the meter)
  const measure = (an) => {
    an.getFloatTimeDomainData(buf);
    for (let b = 0; b < blocks; b++) {
      let s = 0;
      for (let i = size - (blocks - b) * block, e = i + block; i < e; i++) s += buf[i] * buf[i];
      levels[b] = Math.sqrt(s / block);
    }
    let s = 0;
    for (let i = size - 256; i < size; i++) s += buf[i] * buf[i];
    return Math.sqrt(s / 256);
  };
  const blockEndMs = (now, b) => now - (blocks - b - 1) * block * msPerSample;
  const canvas = $('meter').getContext('2d');
  return setInterval(() => {
    const now = performance.now();
    if (mic) {
      measure(mic);
      let loudest = 0;
      for (let b = 0; b < blocks; b++) loudest = Math.max(loudest, levels[b]);
      state.micMaxRms = Math.max(state.micMaxRms, loudest);
      const voice = voiceLevel();
      for (let b = blocks - 1; b >= 0; b--) {
        if (levels[b] >= voice) { for (const c of voiceClocks) c.voice(blockEndMs(now, b)); break; }
      }
    }
    const a = measure(agent);
    let first = -1;
    for (let b = 0; b < blocks; b++) if (levels[b] > AGENT_AUDIBLE) { first = b; break; }
    state.agentMaxRms = Math.max(state.agentMaxRms, a);
    const start = first >= 0 ? blockEndMs(now, first) - block * msPerSample : 0;
    for (const c of agentClocks) c.agent(first >= 0, start, now);
    canvas.fillStyle = '#f1f3f6'; canvas.fillRect(0, 0, 160, 28);
    canvas.fillStyle = '#0f766e'; canvas.fillRect(0, 0, Math.min(160, a * 800), 28);
  }, 20);
}

// --- WebSocket transport ----------------------------------------------------------------------------
async function startWebSocket(stream, media) {
  const ctx = new AudioContext({ sampleRate: 16000 });
  if (ctx.state !== 'running') await ctx.resume();
  await ctx.audioWorklet.addModule('/static/capture-worklet.js');
  const src = ctx.createMediaStreamSource(stream);
  const capture = new AudioWorkletNode(ctx, 'pcm-capture');
  const sink = ctx.createGain(); sink.gain.value = 0;  // keeps the worklet pulled, silently
  src.connect(capture).connect(sink).connect(ctx.destination);
  const out = ctx.createGain(); out.connect(ctx.destination);

  const ws = new WebSocket(media.ws);
  ws.binaryType = 'arraybuffer';
  let playHead = 0;
  const playing = new Set();
  capture.port.onmessage = (e) => {
    if (ws.readyState === WebSocket.OPEN) { ws.send(e.data); state.micFrames++; }
  };
  ws.onmessage = (e) => {
    if (typeof e.data === 'string') { onEvent(JSON.parse(e.data)); return; }
    const pcm = new Int16Array(e.data);
    const buf = ctx.createBuffer(1, pcm.length, 16000);
    const ch = buf.getChannelData(0);
    for (let i = 0; i < pcm.length; i++) ch[i] = pcm[i] / 32768;
    const node = ctx.createBufferSource();
    node.buffer = buf; node.connect(out);
    // The server sends the first 60 ms of each stretch of agent audio at once, which absorbs
    // network jitter; 10 ms of margin when playback (re)starts, back-to-back frames after that.
    playHead = Math.max(playHead, ctx.currentTime + 0.01);
    node.start(playHead); playHead += buf.duration;
    playing.add(node); node.onended = () => playing.delete(node);
    state.agentChunks++;
  };
  ws.onclose = (e) => {
    if (call && call.ws === ws) finish(e.code === 1000 || e.code === 1005 ? 'ended' : 'failed', e.reason);
  };
  ws.onerror = () => showError('WebSocket error');
  const clock = turnClock('voiceToVoiceMs');
  const micCopy = watchCapture(stream.getAudioTracks()[0], [clock]);
  const timer = watchLevels(ctx, src, out, micCopy ? [] : [clock], [clock]);
  return {
    ws, ctx, timer, micCopy,
    flushPlayback() { for (const n of playing) n.stop(); playing.clear(); playHead = 0; },
    hangup() {
      if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: 'hangup' }));
      ws.close(1000);
    },
  };
}

// --- WebRTC transport --------------------------------------------------------------------------------
async function startWebRTC(stream, media) {
  const ctx = new AudioContext();
  if (ctx.state !== 'running') await ctx.resume();
  // The agent is heard through a media element, which plays the track as it leaves Chromium's
  // jitter buffer. Routed through WebAudio instead, it would wait ~30 ms more in the hand-off
  // between the two (measured; benchmarks/RESULTS.md). WebAudio only listens, for the meter.
  // (Chromium feeds a remote WebRTC stream to WebAudio only while an element plays it anyway:
  // crbug 933677.)
  const out = ctx.createGain();
  const sink = ctx.createGain(); sink.gain.value = 0;
  out.connect(sink).connect(ctx.destination);  // keeps the meter's analyser pulled, silently
  const pc = new RTCPeerConnection({ iceServers: [] });
  const dc = pc.createDataChannel('events');
  dc.onmessage = (e) => onEvent(JSON.parse(e.data));
  for (const t of stream.getAudioTracks()) pc.addTrack(t, stream);
  let element = null;
  let receiver = null;
  pc.ontrack = (e) => {
    const remote = e.streams[0] || new MediaStream([e.track]);
    element = new Audio(); element.srcObject = remote;
    element.play().catch((err) => showError(`audio element: ${err}`));
    ctx.createMediaStreamSource(remote).connect(out);
    receiver = e.receiver;
    state.agentChunks++;
  };
  pc.onconnectionstatechange = () => {
    if (pc.connectionState === 'failed' && call && call.pc === pc) finish('failed', 'connection failed');
  };
  dc.onclose = () => { if (call && call.pc === pc) finish('ended'); };
  await pc.setLocalDescription(await pc.createOffer());
  // no trickle ICE: wait (bounded) for gathering, then send the whole offer
  await new Promise((resolve) => {
    if (pc.iceGatheringState === 'complete') return resolve();
    pc.addEventListener('icegatheringstatechange', () => pc.iceGatheringState === 'complete' && resolve());
    setTimeout(resolve, 2000);
  });
  const r = await fetch(media.offer, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ sdp: pc.localDescription.sdp, type: pc.localDescription.type }),
  });
  if (!r.ok) { pc.close(); throw new Error(`offer refused: ${r.status} ${(await r.text()).trim()}`); }
  await pc.setRemoteDescription(await r.json());
  // Voice-to-voice ends where the element starts playing the agent: the receiver reports, for
  // each 10-ms chunk it hands to the track, when, and the level of the packet it came from (the
  // RTP audio-level extension the server sets from the frame it encodes). Polled faster than
  // chunks are played, so an onset is placed to its chunk; a late poll only ever reads later.
  // The analyser's view (the agent heard inside WebAudio) is kept beside it for comparison.
  const playout = turnClock('voiceToVoiceMs');
  const inWebAudio = turnClock('voiceToVoiceWebAudioMs');
  const micCopy = watchCapture(stream.getAudioTracks()[0], [playout, inWebAudio]);
  const timer = micCopy
    ? watchLevels(ctx, null, out, [], [inWebAudio])
    : watchLevels(ctx, ctx.createMediaStreamSource(stream), out, [playout, inWebAudio], [inWebAudio]);
  const playoutTimer = setInterval(() => {
    if (!receiver) return;
    const now = performance.now();
    for (const s of receiver.getSynchronizationSources()) {
      if (s.audioLevel === undefined) continue;
      // a 20-ms packet's RMS: half the 5-ms block threshold when only one of its blocks is loud
      playout.agent(s.audioLevel > AGENT_AUDIBLE / 2, s.timestamp - performance.timeOrigin, now);
    }
  }, 4);
  // The browser's receive jitter buffer, for the latency budget: how long agent audio waited
  // in it on average, what it aimed for, the interarrival jitter and what it concealed.
  const statsTimer = setInterval(async () => {
    if (pc.connectionState !== 'connected') return;
    (await pc.getStats()).forEach((s) => {
      if (s.type !== 'inbound-rtp' || s.kind !== 'audio' || !s.jitterBufferEmittedCount) return;
      const perSample = (x) => (x === undefined ? null : Math.round(1000 * x / s.jitterBufferEmittedCount));
      state.rtp = {
        jitterBufferMs: perSample(s.jitterBufferDelay), targetMs: perSample(s.jitterBufferTargetDelay),
        jitterMs: s.jitter === undefined ? null : Math.round(1000 * s.jitter * 10) / 10,
        concealedMs: Math.round(1000 * (s.concealedSamples || 0) / 48000),
        packetsLost: s.packetsLost, packetsReceived: s.packetsReceived,
      };
    });
  }, 1000);
  return {
    pc, ctx, timer, statsTimer, playoutTimer, micCopy,
    // the server flushes its queue on barge-in; what Chromium's jitter buffer holds is < 100 ms
    flushPlayback() {},
    hangup() {
      if (dc.readyState === 'open') dc.send(JSON.stringify({ type: 'hangup' }));
      if (element) element.srcObject = null;
      setTimeout(() => pc.close(), 100);
    },
  };
}

// --- call control ------------------------------------------------------------------------------------
async function startCall() {
  const transport = document.querySelector('input[name=transport]:checked').value;
  $('error').textContent = '';
  state.transport = transport;
  setStatus('connecting');
  try {
    const stream = await navigator.mediaDevices.getUserMedia(MIC_CONSTRAINTS);
    const media = await mediaAddresses();
    const handles = transport === 'ws' ? await startWebSocket(stream, media) : await startWebRTC(stream, media);
    call = { ...handles, stream };
    if (transport === 'webrtc') setStatus(state.status === 'connecting' ? 'negotiated' : state.status);
  } catch (err) {
    showError(String(err.message || err));
    setStatus('failed');
  }
}

function finish(status, reason) {
  const c = call;
  call = null;
  if (!c) return;
  clearInterval(c.timer);
  if (c.statsTimer) clearInterval(c.statsTimer);
  if (c.playoutTimer) clearInterval(c.playoutTimer);
  for (const t of c.stream.getTracks()) t.stop();
  if (c.micCopy) c.micCopy.stop();
  setTimeout(() => c.ctx.close(), 200);
  if (reason) showError(reason);
  $('you').classList.remove('on'); $('agent').classList.remove('on');
  setStatus(status);
}

function hangUp() {
  if (!call) return;
  call.hangup();
  finish('ended');
}

$('call').addEventListener('click', () => (call ? hangUp() : startCall()));
window.voxlineCall = { start: startCall, hangUp };

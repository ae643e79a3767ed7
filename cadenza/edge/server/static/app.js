// The browser client at / (index.html): WebRTC to this server, its data channel for control.
// A file of its own because the page's Content-Security-Policy runs no inline script.
"use strict";
const $ = (id) => document.getElementById(id);
const state = { pc: null, channel: null, speakingSince: null, micStream: null,
  // The utterance playing: its resume token, the samples its track has played, and when the
  // node last said anything (it reports every half second while it plays).
  playing: null, heardAt: 0, resumes: 0,
  // Type-in mode: the words still to send, their pace, and the text stream they go to (null
  // until the server starts it).
  typing: null };
const SILENT_NODE_MS = 2000;  // no word from the node this long while playing: it is lost
// How long a resume delivered may go unanswered before the page offers it again: the node that
// takes it waits up to 3.5 s for the lost node's claim on the stream to lapse (docs/scaling.md),
// and a loaded node takes a while longer to admit it. Offering the token again once a node has
// claimed it can only be refused (resume_not_found), so the page waits generously; a resume
// that could not be sent (no open channel) is offered again at the next tick.
const RESUME_ANSWER_MS = 15000;
window.cadenza = state;

function show(id, value) { $(id).textContent = value; }
function fail(message) { show("error", message); show("status", "error"); }

// An HTTP refusal as the page shows it: the documented code, then the server's message.
function refusal(body, response) {
  const error = body && body.error;
  return new Error(error ? `${error.code}: ${error.message}` : response.statusText);
}

async function connect(fresh = false) {
  if (!fresh && state.channel && state.channel.readyState === "open") return;
  if (fresh && state.pc) state.pc.close();
  const auth = $("apikey").value ? { Authorization: `Bearer ${$("apikey").value}` } : {};
  const configured = await fetch("/v1/webrtc/config", { headers: auth });
  const config = await configured.json();
  if (!configured.ok) throw refusal(config, configured);
  const pc = new RTCPeerConnection({ iceServers: config.ice_servers });
  state.pc = pc;
  if ($("mic").checked) {
    state.micStream = await navigator.mediaDevices.getUserMedia({ audio: true });
    for (const track of state.micStream.getTracks()) pc.addTrack(track, state.micStream);
    watchMicrophone(state.micStream);
    pc.getTransceivers()[0].direction = "sendrecv";
  } else {
    pc.addTransceiver("audio", { direction: "recvonly" });
  }
  pc.ontrack = (event) => {
    // Chrome feeds a Web Audio source from a remote track only while a media element plays
    // the track: the <audio> element plays it, the analyser behind it only listens.
    const stream = new MediaStream([event.track]);
    $("player").srcObject = stream;
    watchPlayback(stream);
  };
  const channel = pc.createDataChannel("control");
  state.channel = channel;
  channel.onmessage = (event) => onMessage(JSON.parse(event.data));
  const opened = new Promise((resolve) => { channel.onopen = resolve; });
  await pc.setLocalDescription(await pc.createOffer());
  const headers = { "Content-Type": "application/json" };
  if ($("apikey").value) headers["Authorization"] = `Bearer ${$("apikey").value}`;
  const response = await fetch("/v1/webrtc/offer", {
    method: "POST",
    headers,
    body: JSON.stringify({ sdp: pc.localDescription.sdp, type: "offer" }),
  });
  const answer = await response.json();
  if (!response.ok) throw refusal(answer, response);
  await pc.setRemoteDescription(answer);
  await opened;
}

function onMessage(message) {
  state.heardAt = performance.now();
  if (message.type === "started") {
    state.playing = message.resume_token ? { token: message.resume_token, played: 0 } : null;
    drawWaveformWhilePlaying();
    if (state.typing && state.typing.streamId === null && !message.resumed) {
      startTyping(message.stream_id);
    }
    if (message.resumed) {
      show("status", `playing (resumed on another node after ${state.gapMs} ms)`);
      return;
    }
  } else if (message.type === "done" || message.type === "error") {
    state.playing = null;
    stopWaveformSoon();
    const typing = state.typing;
    if (typing && message.type === "error") {
      // An error ends the typing too: what the stream has is spoken, then it is done.
      if (typing.streamId !== null) send({ type: "text_end", stream_id: typing.streamId });
      stopTyping();
    } else if (typing && message.stream_id === typing.streamId) stopTyping();
  } else if (message.type === "stats") {
    plotBuffer(message);
    if (state.playing && message.played_samples != null) {
      state.playing.played = message.played_samples;
    }
  }
  if (message.type === "queued") {
    show("status", "waiting for a free slot");
    show("queue", `${message.position} (about ${message.estimated_wait_s} s)`);
  } else if (message.type === "started") {
    show("status", "playing"); show("ttfa", "…"); show("queue", "–");
  }
  else if (message.type === "done") {
    show("status", message.reason === "cancelled" ? "stopped" : "done");
    const stats = message.stats || {};
    if (stats.ttfa_ms != null) show("ttfa", `${stats.ttfa_ms} ms`);
    if (stats.segments != null) {
      const waitMs = stats.text_wait_ms;
      const waited = waitMs != null ? `, ${waitMs} ms waiting for text` : "";
      show("text-stream", `${stats.segments} segments${waited}`);
    }
  } else if (message.type === "segment") {
    show("segment", message.text);
  } else if (message.type === "stats") {
    if (message.ttfa_ms != null) show("ttfa", `${message.ttfa_ms} ms`);
    show("underruns", String(message.underruns));
    show("buffer", `${message.buffer_ms} ms`);
  } else if (message.type === "conversation") {
    show("conversation", `${message.turns} turns, ${message.audio_s} s of audio`);
  } else if (message.type === "error") { fail(`${message.code}: ${message.message}`); }
}

// A node lost mid-utterance (servers with stream checkpoints): offer again through the same
// address, which a front door sends to another node, and resume from what was played.
setInterval(async () => {
  const playing = state.playing;
  if (!playing || state.resuming || performance.now() - state.heardAt < SILENT_NODE_MS) return;
  state.resuming = true;
  const lostAt = state.heardAt;
  show("status", "node lost: resuming");
  try {
    await connect(true);
    state.gapMs = Math.round(performance.now() - lostAt);
    if (!send({ type: "resume", token: playing.token, samples_heard: playing.played })) {
      throw new Error("no open channel to send the resume on");
    }
    state.resumes += 1;
    state.heardAt = performance.now() + RESUME_ANSWER_MS - SILENT_NODE_MS;
  } catch (error) {  // no node answered the offer: try again on the next tick, for a while
    if (performance.now() - lostAt > 20000) {
      state.playing = null;
      fail(`the stream could not be resumed: ${error.message}`);
    }
  } finally { state.resuming = false; }
}, 250);

// Whether ``message`` went out (the control channel is open).
function send(message) {
  if (!state.channel || state.channel.readyState !== "open") return false;
  state.channel.send(JSON.stringify(message));
  return true;
}

// Barge-in by voice: a few frames of microphone energy while playing cancel the utterance.
function watchMicrophone(stream) {
  const context = new AudioContext();
  const analyser = context.createAnalyser();
  context.createMediaStreamSource(stream).connect(analyser);
  const samples = new Float32Array(analyser.fftSize);
  let loudFrames = 0;
  setInterval(() => {
    analyser.getFloatTimeDomainData(samples);
    const rms = Math.sqrt(samples.reduce((sum, x) => sum + x * x, 0) / samples.length);
    loudFrames = rms > 0.05 ? loudFrames + 1 : 0;
    if (loudFrames === 5 && $("status").textContent === "playing") cancel();
  }, 20);
}

// Text-streaming demo: the textarea's words go out one at a time, the way a person or a
// language model would produce them, once the server has started the stream.
function startTyping(streamId) {
  const typing = state.typing;
  typing.streamId = streamId;
  const next = () => {
    const word = typing.words.shift();
    if (word !== undefined) send({ type: "text", stream_id: streamId, text: `${word} ` });
    else { send({ type: "text_end", stream_id: streamId }); stopTyping(); }
  };
  next();
  typing.timer = setInterval(next, typing.intervalMs);
}
function stopTyping() {
  if (state.typing) clearInterval(state.typing.timer);
  state.typing = null;
}

// What the page shows of the audio: the waveform of what it plays, and the server's jitter
// buffer depth from each stats message. The counters are for tests to read.
const view = { waveformFrames: 0, bufferPoints: 0 };
window.cadenzaView = view;
const plot = { context: null, analyser: null, source: null, drawUntil: 0, drawing: false,
  peakHeld: 0, buffer: [], underruns: 0 };
const PLOT_WINDOW_MS = 30000;
const TAIL_MS = 1000;  // the browser's own playout delay still holds audio after "done"
const SILENCE = 0.01;  // a peak below this counts as silence
// The waveform is scaled to its recent peak (held, falling 5% a frame) so that quiet audio
// still shows its shape, but never by more than 1 / GAIN_FLOOR, so that noise stays small.
const GAIN_FLOOR = 0.05;
const INK = "#1a73e8", MUTED = "#999", UNDERRUN = "#d93025";

function playbackAnalyser() {
  if (!plot.context) {
    plot.context = new AudioContext();
    plot.analyser = plot.context.createAnalyser();
    plot.analyser.fftSize = 2048;
  }
  plot.context.resume();
  return plot.analyser;
}
function watchPlayback(stream) {
  const analyser = playbackAnalyser();
  if (plot.source) plot.source.disconnect();
  // Not connected on to the speakers: the <audio> element plays the track.
  plot.source = plot.context.createMediaStreamSource(stream);
  plot.source.connect(analyser);
}

// The canvas at the screen's pixel density, cleared, in CSS pixels.
function fitCanvas(canvas) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth, height = canvas.clientHeight;
  if (canvas.width !== Math.round(width * ratio)) canvas.width = Math.round(width * ratio);
  if (canvas.height !== Math.round(height * ratio)) canvas.height = Math.round(height * ratio);
  const context = canvas.getContext("2d");
  context.setTransform(ratio, 0, 0, ratio, 0, 0);
  context.clearRect(0, 0, width, height);
  return { context, width, height };
}

function drawWaveformWhilePlaying() {
  plot.drawUntil = Infinity;
  if (!plot.drawing && plot.analyser) {
    plot.drawing = true;
    requestAnimationFrame(drawWaveform);
  }
}
function stopWaveformSoon() { plot.drawUntil = performance.now() + TAIL_MS; }

function drawWaveform(now) {
  const samples = new Float32Array(plot.analyser.fftSize);
  const playing = now < plot.drawUntil;
  if (playing) plot.analyser.getFloatTimeDomainData(samples);
  const peak = samples.reduce((most, x) => Math.max(most, Math.abs(x)), 0);
  plot.peakHeld = Math.max(peak, plot.peakHeld * 0.95);
  const gain = 0.9 / Math.max(plot.peakHeld, GAIN_FLOOR);
  traceWaveform(samples, peak >= SILENCE ? INK : MUTED, gain);
  if (playing) {
    const dbfs = peak > 0 ? `${Math.round(20 * Math.log10(peak))} dBFS` : "silent";
    labelWaveform(`peak ${dbfs}`);
  }
  if (peak >= SILENCE) view.waveformFrames += 1;
  if (playing) requestAnimationFrame(drawWaveform);
  else plot.drawing = false;  // the flat line just drawn stays until the next stream
}
function traceWaveform(samples, color, gain = 1) {
  const { context, width, height } = fitCanvas($("waveform"));
  context.lineWidth = 1.5;
  context.strokeStyle = color;
  context.beginPath();
  samples.forEach((sample, i) => {
    const x = (i / (samples.length - 1)) * width;
    const y = height / 2 - sample * gain * (height / 2 - 2);
    if (i === 0) context.moveTo(x, y); else context.lineTo(x, y);
  });
  context.stroke();
}

function labelWaveform(text) {
  const canvas = $("waveform"), context = canvas.getContext("2d");
  context.font = "11px system-ui, sans-serif";
  context.fillStyle = MUTED;
  context.textAlign = "right"; context.textBaseline = "top";
  context.fillText(text, canvas.clientWidth - 6, 4);
}

function plotBuffer(stats) {
  const now = performance.now();
  plot.buffer.push({ at: now, bufferMs: stats.buffer_ms,
    underrun: stats.underruns > plot.underruns });
  plot.underruns = stats.underruns;  // a new utterance counts from zero again
  plot.buffer = plot.buffer.filter((point) => now - point.at <= PLOT_WINDOW_MS);
  drawBufferPlot(now);
  view.bufferPoints += 1;
}

function drawBufferPlot(now) {
  const { context, width, height } = fitCanvas($("buffer-plot"));
  const left = 52, right = width - 8, top = 10, bottom = height - 20;
  const highestMs = Math.max(...plot.buffer.map((point) => point.bufferMs));
  const scaleMs = Math.max(100, Math.ceil(highestMs / 100) * 100);
  const x = (at) => right - ((now - at) / PLOT_WINDOW_MS) * (right - left);
  const y = (ms) => bottom - (Math.min(ms, scaleMs) / scaleMs) * (bottom - top);

  context.font = "11px system-ui, sans-serif";
  context.fillStyle = MUTED;
  context.strokeStyle = "#ddd";
  context.lineWidth = 1;
  context.beginPath();
  context.moveTo(left, y(scaleMs)); context.lineTo(right, y(scaleMs));
  context.moveTo(left, y(0)); context.lineTo(right, y(0));
  context.stroke();
  context.textAlign = "right"; context.textBaseline = "middle";
  const scaleLabel = scaleMs < 1000 ? `${scaleMs} ms` : `${scaleMs / 1000} s`;
  context.fillText(scaleLabel, left - 6, y(scaleMs));
  context.fillText("0", left - 6, y(0));
  context.textBaseline = "top";
  context.fillText("now", right, bottom + 5);
  context.textAlign = "left";
  context.fillText("−30 s", left, bottom + 5);

  context.strokeStyle = UNDERRUN;
  context.beginPath();
  for (const point of plot.buffer.filter((p) => p.underrun)) {
    context.moveTo(x(point.at), top); context.lineTo(x(point.at), bottom);
  }
  context.stroke();

  context.strokeStyle = INK;
  context.lineWidth = 2;
  context.lineJoin = "round";
  context.beginPath();
  plot.buffer.forEach((point, i) => {
    if (i === 0) context.moveTo(x(point.at), y(point.bufferMs));
    else context.lineTo(x(point.at), y(point.bufferMs));
  });
  context.stroke();
}

traceWaveform(new Float32Array(2), MUTED);
drawBufferPlot(performance.now());

// The models this server serves and their voices, from /v1/models.
let models = [];
async function loadModels() {
  const headers = {};
  if ($("apikey").value) headers["Authorization"] = `Bearer ${$("apikey").value}`;
  const response = await fetch("/v1/models", { headers });
  if (!response.ok) return;
  models = (await response.json()).data;
  $("model").replaceChildren(...models.map((m) => new Option(m.id, m.id)));
  showVoices();
}
function showVoices() {
  const model = models.find((m) => m.id === $("model").value);
  $("voice").replaceChildren(...(model ? model.voices : []).map((v) => new Option(v, v)));
}
$("model").onchange = showVoices;
$("apikey").onchange = loadModels;
// An app server that minted a client token for this page may hand it over in the address's
// fragment (#token=...), which browsers never send to a server; it is taken and wiped.
const handed = new URLSearchParams(location.hash.slice(1)).get("token");
if (handed) {
  $("apikey").value = handed;
  history.replaceState(null, "", location.pathname + location.search);
}
loadModels();

$("speak").onclick = async () => {
  show("error", ""); show("segment", ""); show("text-stream", "–");
  stopTyping();
  playbackAnalyser();  // in the click: a page may start an AudioContext only on a gesture
  try {
    show("status", "connecting");
    await connect();
    // standard: a person at this page would rather wait a few seconds, seeing the queue
    // position, than be refused the moment the server is full (realtime's behaviour).
    const message = { type: "speak", text: $("text").value, priority: "standard" };
    if ($("model").value) message.model = $("model").value;
    if ($("voice").value) message.voice = $("voice").value;
    if ($("converse").checked) {
      message.conversation = true;
      if ($("mic").checked) {
        // The listener's turn is spoken as another of the model's voices (a speaker id).
        const model = models.find((m) => m.id === $("model").value);
        const others = (model ? model.voices : []).filter((v) => v !== $("voice").value);
        message.use_audio_prompt = true;
        message.user_voice = others.length ? others[0] : $("voice").value;
      }
    }
    if ($("type-in").checked) {
      message.text_stream = true;
      message.text = "";
      const wordsPerSecond = Math.min(20, Math.max(1, Number($("type-in-rate").value) || 5));
      state.typing = { words: $("text").value.split(/\s+/).filter(Boolean),
        intervalMs: 1000 / wordsPerSecond, streamId: null, timer: null };
    }
    send(message);
  } catch (error) { fail(error.message); }
};
function cancel() {
  stopTyping();
  send({ type: "cancel" });
}
$("stop").onclick = cancel;
$("reset").onclick = () => send({ type: "reset_conversation" });

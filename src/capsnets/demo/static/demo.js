// capsnets demo page: draw (or pick) an input, show its class capsules, reconstruction, dimensions and routing.
// Plain JavaScript, no build step; talks to the JSON API of capsnets/demo/app.py.
"use strict";

const $ = (id) => document.getElementById(id);
const STEP_LIMIT = 0.25;  // slider range: -0.25 ... +0.25, the perturbations of Sabour et al. (2017), Fig. 4

const state = {
  info: null,
  input: null,      // the last input sent: {image, frame} or {pixels}
  picked: null,     // the class capsule the user picked (null: the winner)
  result: null,     // the last /api/predict answer
  base: null,       // the shown capsule's vector before the sliders moved it
  sequence: 0,      // answers to older requests are dropped
  grid: null,       // what the perturbation grid shows: {input, capsule}; null: not drawn
  gridSequence: 0,  // grid answers to older requests are dropped
  compiled: false,  // a prediction came back (the EM kernel, if it needed compiling, is built)
};

let pending = 0;  // requests in flight, shown as <body data-pending> (tests wait for 0)

async function api(path, body) {
  const options = body === undefined ? {} : {
    method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)};
  document.body.dataset.pending = ++pending;
  try {
    const response = await fetch(path, options);
    const answer = await response.json().catch(() => ({detail: response.statusText}));
    if (!response.ok) throw new Error(answer.detail || response.statusText);
    return answer;
  } finally {
    document.body.dataset.pending = --pending;
  }
}

function report(error) {
  $("status").textContent = error ? String(error.message || error) : "";
}

// ---- the model and the page's parts that depend on it ------------------------------------------------------
async function start() {
  try {
    state.info = await api("/api/info");
  } catch (error) {
    report(error);
    return;
  }
  const info = state.info;
  $("model").textContent = `${info.model} (${info.kind} capsules) on ${info.dataset || "an unknown data set"}: ${info.source}`;
  if (info.note) { $("note").textContent = info.note; $("note").hidden = false; }
  $("scores-what").textContent = info.kind === "matrix"
    ? "the activation of each class capsule; click a class to see its pose"
    : info.decoder
      ? "the length of each class capsule; click a class to reconstruct from its capsule"
      : "the length of each class capsule";
  // the capsule panel is titled for what it shows: a reconstruction, a pose matrix, or neither
  $("capsule-title").textContent = info.decoder
    ? "Reconstruction from capsule"
    : info.kind === "matrix" ? "Pose of class capsule" : "Class capsule";
  buildBars(info.classes);
  if (info.decoder) {
    buildSliders(info.capsule_dim);
  } else {
    $("decoder-part").hidden = true;
    $("pose-part").hidden = info.kind !== "matrix";
    $("no-decoder").hidden = info.kind === "matrix";
    $("grid-button").disabled = true;
    $("grid-what").textContent = "this model has no decoder: there is no grid to draw";
  }
  loadSamples();
}

function buildBars(classes) {
  const bars = $("bars");
  bars.innerHTML = "";
  classes.forEach((name, k) => {
    const row = document.createElement("div");
    row.className = "bar-row";
    row.setAttribute("role", "listitem");
    row.dataset.index = k;
    row.innerHTML = '<span class="label"></span><span class="track"><span class="fill"></span></span><span class="value"></span>';
    row.querySelector(".label").textContent = name;
    row.addEventListener("click", () => pick(k));
    bars.appendChild(row);
  });
}

function buildSliders(dims) {
  const sliders = $("sliders");
  sliders.innerHTML = "";
  for (let d = 0; d < dims; d++) {
    const label = document.createElement("label");
    label.innerHTML = `<span>dim ${d}</span><input type="range" min="${-STEP_LIMIT}" max="${STEP_LIMIT}" step="0.01" value="0"><output>+0.00</output>`;
    const slider = label.querySelector("input");
    slider.id = `dim-${d}`;
    slider.dataset.dim = d;
    slider.addEventListener("input", () => {
      label.querySelector("output").textContent = signed(Number(slider.value));
      reconstruct();
    });
    sliders.appendChild(label);
  }
}

function signed(value) { return (value >= 0 ? "+" : "\u2212") + Math.abs(value).toFixed(2); }

// ---- drawing ------------------------------------------------------------------------------------------------
const canvas = $("canvas");
const pen = canvas.getContext("2d");
let drawing = false, last = null, timer = null;

function clearCanvas() {
  pen.fillStyle = "#000";
  pen.fillRect(0, 0, canvas.width, canvas.height);
}

function point(event) {
  const box = canvas.getBoundingClientRect();
  return {x: (event.clientX - box.left) * canvas.width / box.width, y: (event.clientY - box.top) * canvas.height / box.height};
}

canvas.addEventListener("pointerdown", (event) => {
  event.preventDefault();
  canvas.setPointerCapture(event.pointerId);
  drawing = true;
  last = point(event);
  stroke(last, last);
});
canvas.addEventListener("pointermove", (event) => {
  if (!drawing) return;
  const here = point(event);
  stroke(last, here);
  last = here;
  if (timer === null) timer = setTimeout(() => { timer = null; predictDrawing(); }, 250);  // live while drawing
});
for (const kind of ["pointerup", "pointercancel"]) {
  canvas.addEventListener(kind, () => {
    if (!drawing) return;
    drawing = false;
    clearTimeout(timer);
    timer = null;
    predictDrawing();
  });
}

function stroke(from, to) {
  pen.strokeStyle = "#fff";
  pen.lineWidth = 28;
  pen.lineCap = "round";
  pen.lineJoin = "round";
  pen.beginPath();
  pen.moveTo(from.x, from.y);
  pen.lineTo(to.x, to.y);
  pen.stroke();
}

function predictDrawing() {
  state.input = {image: canvas.toDataURL("image/png"), frame: true};
  predict();
}

$("clear").addEventListener("click", () => {
  clearCanvas();
  state.picked = null;
});

// ---- predictions ------------------------------------------------------------------------------------------
async function predict() {
  if (!state.input) return;
  const sequence = ++state.sequence;
  compiling(!state.compiled && Boolean(state.info && state.info.kernel_note));
  try {
    const body = {...state.input};
    if (state.picked !== null) body.capsule = state.picked;
    const result = await api("/api/predict", body);
    state.compiled = true;
    compiling(false);
    if (sequence !== state.sequence) return;  // an answer to an older input
    report(null);
    show(result);
  } catch (error) {
    state.compiled = true;
    compiling(false);
    if (sequence === state.sequence) report(error);
  }
}

// the first prediction of a matrix capsule model may compile the EM routing kernel: say so while it waits
function compiling(waiting) {
  $("compiling").textContent = waiting ? `${state.info.kernel_note}\u2026` : "";
  $("compiling").hidden = !waiting;
}

function show(result) {
  state.result = result;
  $("empty").hidden = true;
  for (const id of ["seen", "prediction-part", "scores-what", "bars", "capsule-panel", "grid-panel"]) $(id).hidden = false;
  $("input").src = result.input;
  $("notes").innerHTML = "";
  for (const note of result.notes) {
    const item = document.createElement("li");
    item.textContent = note;
    $("notes").appendChild(item);
  }
  $("prediction").textContent = result.label;
  $("unsure").textContent = result.uncertain ? `Unsure: ${result.doubt}.` : "";
  $("unsure").hidden = !result.uncertain;
  const top = Math.max(1e-9, ...result.scores);
  document.querySelectorAll("#bars .bar-row").forEach((row, k) => {
    const score = result.scores[k];
    row.querySelector(".fill").style.width = `${(100 * Math.min(1, state.info.kind === "matrix" ? score / top : score)).toFixed(1)}%`;
    row.querySelector(".value").textContent = score.toFixed(3);
    row.classList.toggle("winner", k === result.prediction);
    row.classList.toggle("shown", k === result.shown);
  });
  $("shown").textContent = result.classes[result.shown];
  state.base = result.capsules[result.shown];
  document.querySelectorAll("#sliders input").forEach((slider) => {
    slider.value = 0;
    slider.nextElementSibling.textContent = signed(0);
  });
  if (result.reconstruction) $("reconstruction").src = result.reconstruction;
  if (state.info.kind === "matrix") showPose(state.base);
  showCouplings(result);
  if (state.grid && (state.grid.input !== state.input || state.grid.capsule !== result.shown)) drawGrid();
}

function showPose(pose) {
  const side = Math.round(Math.sqrt(pose.length));
  const top = Math.max(1e-9, ...pose.map(Math.abs));
  const table = $("pose");
  table.innerHTML = "";
  for (let r = 0; r < side; r++) {
    const row = table.insertRow();
    for (let c = 0; c < side; c++) {
      const value = pose[r * side + c];
      const cell = row.insertCell();
      cell.textContent = value.toFixed(3);
      const strength = Math.abs(value) / top;
      cell.style.background = value >= 0 ? `rgba(66, 99, 235, ${strength * 0.6})` : `rgba(217, 72, 15, ${strength * 0.6})`;
    }
  }
}

function showCouplings(result) {
  const couplings = result.couplings;
  $("routing-panel").hidden = !couplings;
  if (!couplings) return;
  $("overlay").src = couplings.overlay;
  $("overlay-class").textContent = result.classes[result.shown];
  $("couplings-what").textContent = couplings.what + "; one scale for all classes.";
  const maps = $("maps");
  maps.innerHTML = "";
  couplings.maps.forEach((source, k) => {
    const figure = document.createElement("figure");
    figure.innerHTML = '<img alt=""><figcaption></figcaption>';
    figure.querySelector("img").src = source;
    figure.querySelector("img").alt = `routed to class ${result.classes[k]}`;
    figure.querySelector("figcaption").textContent = result.classes[k];
    figure.classList.toggle("shown", k === result.shown);
    figure.addEventListener("click", () => pick(k));
    maps.appendChild(figure);
  });
}

function pick(k) {
  state.picked = k;
  predict();
}

// ---- the sliders: decode the shown capsule with its dimensions moved --------------------------------------
async function reconstruct() {
  if (!state.result || !state.base) return;
  const sequence = ++state.sequence;
  const vector = state.base.map((value, d) => value + Number($(`dim-${d}`).value));
  try {
    const answer = await api("/api/reconstruct", {capsule: vector, class: state.result.shown});
    if (sequence !== state.sequence) return;
    report(null);
    $("reconstruction").src = answer.reconstruction;
  } catch (error) {
    if (sequence === state.sequence) report(error);
  }
}

$("reset").addEventListener("click", () => {
  if (state.result) show(state.result);
});

// ---- the perturbation grid: of the capsule shown, redrawn when the input or the capsule shown changes --------
async function drawGrid() {
  if (!state.input || !state.result) { report("draw a digit or pick a test image first"); return; }
  const wanted = {input: state.input, capsule: state.result.shown};
  const sequence = ++state.gridSequence;
  state.grid = wanted;
  $("grid-button").disabled = true;
  try {
    const answer = await api("/api/perturbations", {...wanted.input, capsule: wanted.capsule});
    if (sequence !== state.gridSequence) return;  // an answer for an older input or capsule
    report(null);
    $("grid").src = answer.grid;
    $("grid-class").textContent = answer.label;
    $("grid-title").hidden = false;
    gridLabels(answer.steps, answer.dimensions);
    $("grid-figure").hidden = false;
  } catch (error) {
    if (sequence === state.gridSequence) report(error);
  } finally {
    if (sequence === state.gridSequence) $("grid-button").disabled = false;
  }
}

function gridLabels(steps, dimensions) {
  $("grid-steps").innerHTML = "";
  for (const step of steps) {
    const label = document.createElement("span");
    label.textContent = signed(step);
    $("grid-steps").appendChild(label);
  }
  $("grid-dims").innerHTML = "";
  for (let d = 0; d < dimensions; d++) {
    const label = document.createElement("span");
    label.textContent = String(d);
    $("grid-dims").appendChild(label);
  }
}

$("grid-button").addEventListener("click", drawGrid);

// ---- test images ------------------------------------------------------------------------------------------------
async function loadSamples() {
  try {
    const answer = await api("/api/samples");
    if (answer.note) $("samples-note").textContent = answer.note;
    for (const sample of answer.samples) {
      const image = document.createElement("img");
      image.src = sample.image;
      image.alt = image.title = `test image of class ${sample.label}`;
      image.addEventListener("click", () => {
        clearCanvas();
        pen.imageSmoothingEnabled = false;
        pen.drawImage(image, 0, 0, canvas.width, canvas.height);  // shown where drawings are; drawing goes on over it
        state.picked = null;
        state.input = {pixels: sample.pixels};
        predict();
      });
      $("samples").appendChild(image);
    }
  } catch (error) {
    $("samples-note").textContent = `no test images: ${error.message}`;
  }
}

clearCanvas();
start();

// Playground: stream a completion from /v1/completions, then colour each token by the layer it
// exited at (pale yellow = shallow ... red = full depth) or by how it was made (drafted and
// accepted: green; bonus token of a verification step: blue).
const $ = (id) => document.getElementById(id);
const key = () => $("api-key").value || localStorage.getItem("dyncomplete-key") || "";
let served = null;

function headers() {
  const h = { "Content-Type": "application/json" };
  if (key()) h["Authorization"] = "Bearer " + key();
  return h;
}

function colour(token, layers) {
  if (token.source === "draft") return "hsl(130, 60%, 78%)";
  if (token.source === "bonus") return "hsl(210, 70%, 80%)";
  const depth = Math.min(1, token.layers / layers);  // 0 = exited at once, 1 = every layer
  return `hsl(${Math.round(55 - 55 * depth)}, 90%, ${Math.round(86 - 16 * depth)}%)`;
}

function render(stats) {
  const out = $("completion");
  out.textContent = "";
  for (const token of stats.tokens) {
    const span = document.createElement("span");
    span.textContent = token.text;
    span.style.background = colour(token, stats.num_layers);
    span.dataset.layers = token.layers;
    span.dataset.source = token.source;
    span.title = `${token.source}: ${token.layers} of ${stats.num_layers} layers`;
    out.appendChild(span);
  }
  const ms = (s) => (1000 * s).toFixed(0) + " ms";
  const rows = [
    ["method", stats.method],
    ["tokens", stats.new_tokens],
    ["layer evals / token", stats.layer_evals_per_token.toFixed(1) + " of " + stats.num_layers],
    ["compute / token", stats.compute_per_token.toFixed(2)],
    ["drafted / accepted", `${stats.drafted} / ${stats.accepted}`],
    ["prompt tokens", stats.prompt_tokens],
    ["from prefix cache", stats.cached_prompt_tokens],
    ["prefill", ms(stats.prefill_s)],
    ["decode", ms(stats.decode_s)],
    ["queue", ms(stats.queue_s)],
    ["energy", `${stats.energy_j.toFixed(2)} J (${stats.energy_source})`],
    ["stopped by", stats.stopped_by],
  ];
  $("stats").innerHTML = "";
  for (const [name, value] of rows) {
    const tr = $("stats").insertRow();
    tr.insertCell().textContent = name;
    tr.insertCell().textContent = value;
  }
  $("error").textContent = (stats.notices || []).join("; ");
}

async function complete() {
  $("error").textContent = "";
  $("completion").textContent = "";
  $("completion").dataset.state = "running";
  if (!served) await loadModel();
  const body = {
    model: served, prompt: $("prefix").value, max_tokens: Number($("max-tokens").value),
    method: $("method").value || undefined, stream: true,
  };
  if ($("suffix").value) body.suffix = $("suffix").value;
  if ($("line").checked) body.stop = ["\n"];
  try {
    const response = await fetch("/v1/completions", { method: "POST", headers: headers(), body: JSON.stringify(body) });
    if (!response.ok) throw new Error((await response.json()).error.message);
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const line = buffer.slice(0, cut).replace(/^data: /, "");
        buffer = buffer.slice(cut + 2);
        if (line === "[DONE]") continue;
        const chunk = JSON.parse(line);
        if (chunk.error) throw new Error(chunk.error.message);
        if (chunk.dyncomplete) render(chunk.dyncomplete);
        else $("completion").append(chunk.choices[0].text);
      }
    }
  } catch (err) {
    $("error").textContent = String(err.message || err);
  } finally {
    $("completion").dataset.state = "done";
  }
}

async function loadModel() {
  try {
    const response = await fetch("/v1/models", { headers: headers() });
    if (!response.ok) throw new Error((await response.json()).error.message);
    const model = (await response.json()).data[0];
    served = model.id;
    $("served").textContent = `${model.id}, ${model.num_layers} layers`;
    if (!$("method").value) $("method").value = model.default_method;
    $("methods").textContent = "";
    for (const name of model.methods) {  // the server's allowed methods (dyncomplete serve --methods)
      const option = document.createElement("option");
      option.value = name;
      $("methods").appendChild(option);
    }
    $("error").textContent = "";
  } catch (err) {
    $("error").textContent = "cannot reach the server: " + (err.message || err);
  }
}

async function init() {
  $("api-key").value = localStorage.getItem("dyncomplete-key") || "";
  $("api-key").addEventListener("change", () => {
    localStorage.setItem("dyncomplete-key", $("api-key").value);
    loadModel();
  });
  $("complete").addEventListener("click", complete);
  const legend = [["exited early", colour({ source: "exit", layers: 0 }, 1)],
                  ["full depth", colour({ source: "full", layers: 1 }, 1)],
                  ["drafted, accepted", colour({ source: "draft" }, 1)], ["bonus", colour({ source: "bonus" }, 1)]];
  for (const [name, bg] of legend) {
    const span = document.createElement("span");
    span.textContent = name;
    span.style.background = bg;
    $("legend").appendChild(span);
  }
  await loadModel();
}

init();

#!/usr/bin/env node
// Greedy decoding of a GGUF file by llama.cpp itself, through the npm package node-llama-cpp
// and its prebuilt CPU library (tools/install-deps installs it into third_party/).
//   tools/llamacpp-generate.mjs MODEL.gguf PROMPT [N]
// Prints the continuation, then the prompt's token ids, the N generated ids (fewer if the
// model ends its text) and the smallest gap between the chosen token's probability and the
// runner-up's over the N steps (how far each argmax is from a tie). TESSERA_NODE_DIR names
// another directory holding node_modules/node-llama-cpp.
import {dirname, join} from "node:path";
import {fileURLToPath, pathToFileURL} from "node:url";

const usage = "usage: tools/llamacpp-generate.mjs MODEL.gguf PROMPT [N]   (greedy, N tokens, default 64)";
if (process.argv.includes("--help") || process.argv.includes("-h")) {
  console.log(usage);
  process.exit(0);
}
const [modelPath, prompt, count = "64"] = process.argv.slice(2);
if (!modelPath || prompt === undefined) {
  console.error(usage);
  process.exit(2);
}
const nodeDir = process.env.TESSERA_NODE_DIR ||
    join(dirname(fileURLToPath(import.meta.url)), "..", "third_party", "node-llama-cpp");
const entry = join(nodeDir, "node_modules", "node-llama-cpp", "dist", "index.js");
let api;
try {
  api = await import(pathToFileURL(entry).href);
} catch (e) {
  console.error(`llamacpp-generate: error: cannot load node-llama-cpp from '${nodeDir}' ` +
                `(run tools/install-deps): ${e.message}`);
  process.exit(1);
}
const llama = await api.getLlama({gpu: false, build: "never", logLevel: api.LlamaLogLevel.error});
const model = await llama.loadModel({modelPath});
const contextSize = Math.min(256, model.trainContextSize);
// An f32 KV cache (llama.cpp's default is f16), so an f32 model computes in f32 throughout;
// one thread (idle threads spin, which costs seconds a token on a busy machine).
const context = await model.createContext({contextSize, batchSize: contextSize, flashAttention: false, threads: 1,
                                           experimentalKvCacheKeyType: "F32",
                                           experimentalKvCacheValueType: "F32"});
const sequence = context.getSequence();
const promptIds = Array.from(model.tokenize(prompt, false));
const out = [], chosen = [];
let margin = Infinity;
const steps = sequence.evaluateWithMetadata(promptIds, {probabilities: true}, {temperature: 0});
for await (const {token, probabilities} of steps) {
  const ranked = [...probabilities.entries()].sort((a, b) => b[1] - a[1]);
  if (ranked[0][0] !== token) throw new Error(`greedy token ${token} is not the most likely ${ranked[0][0]}`);
  if (model.isEogToken(token)) break;
  if (ranked.length > 1) margin = Math.min(margin, ranked[0][1] - ranked[1][1]);
  out.push(token);
  chosen.push(ranked[0][1]);
  if (out.length >= Number(count)) break;
}
console.log(`--- llama.cpp, greedy ---\n${prompt}${model.detokenize(out)}`);
console.log(`prompt ids: ${promptIds.join(" ")}`);
console.log(`sample ids: ${out.join(" ")}`);
console.log(`min probability gap: ${margin}`);
console.log(`chosen probabilities: ${chosen.join(" ")}`);
await context.dispose();
await model.dispose();

// Greedy decoding by llama.cpp itself, through node-llama-cpp's prebuilt CPU library.
//   node llamacpp_decode.mjs NODE_DIR MODEL.gguf PROMPT N
// NODE_DIR holds node_modules/node-llama-cpp (tools/fetch-node-llama-cpp). Prints the prompt's
// token ids, the N generated ids, and the smallest gap between the chosen token's and the
// runner-up's probability (how robust a comparison of the two argmaxes is).
import {join} from "node:path";
import {pathToFileURL} from "node:url";

const [nodeDir, modelPath, prompt, count] = process.argv.slice(2);
const entry = join(nodeDir, "node_modules", "node-llama-cpp", "dist", "index.js");
const {getLlama, LlamaLogLevel} = await import(pathToFileURL(entry).href);
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});
const model = await llama.loadModel({modelPath});
const contextSize = Math.min(256, model.trainContextSize);
const context = await model.createContext({contextSize, batchSize: contextSize});
const sequence = context.getSequence();
const promptIds = Array.from(model.tokenize(prompt, false));
const out = [];
let margin = Infinity;
const steps = sequence.evaluateWithMetadata(promptIds, {probabilities: true},
                                            {temperature: 0, yieldEogToken: true});
for await (const {token, probabilities} of steps) {
  const ranked = [...probabilities.entries()].sort((a, b) => b[1] - a[1]);
  if (ranked.length > 1) margin = Math.min(margin, ranked[0][1] - ranked[1][1]);
  if (ranked[0][0] !== token) throw new Error(`greedy token ${token} is not the most likely ${ranked[0][0]}`);
  out.push(token);
  if (out.length >= Number(count)) break;
}
console.log(`prompt ids: ${promptIds.join(" ")}`);
console.log(`sample ids: ${out.join(" ")}`);
console.log(`min probability gap: ${margin}`);
await context.dispose();
await model.dispose();

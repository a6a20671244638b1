-- needle.text: tokenizers (docs/text.md), loaded on first use as nd.text.
--
--   nd.text.WordPiece   BERT's tokenizer: vocab.txt, BasicTokenizer + WordPiece
--   nd.text.ByteBPE     GPT-2's byte-level BPE: vocab.json + merges.txt
--   nd.text.answer_spans  question answering: start/end logits -> answers in the text
--
-- Token ids are needle's, 1-based (the vocabulary files' id + 1), so that
-- they index nd.nn.Embedding rows as they come.
return require("needle.lazy")({}, {
  WordPiece = "needle.text.wordpiece",
  ByteBPE = "needle.text.bytebpe",
  answer_spans = {"needle.text.qa"},
}, {who = "text"})

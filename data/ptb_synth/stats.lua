-- written by scripts/gen_corpus.lua (seed 20240611); see README.md
return {
  best_test_ppl = 11.477496,   -- exp(per-token entropy of the true model on test.txt, <eos> included)
  best_valid_ppl = 11.421648,
  best_train_ppl = 11.546323,
  test_entropy_nats = 2.440388,
  test_entropy_bits = 3.520736,
  vocab = 153,             -- distinct tokens in train + valid + test, <eos> included
  grammar_words = 153,     -- words the grammar can produce, <eos> included
  tokens = {train = 100004, valid = 10001, test = 10003},   -- words + one <eos> per line
  sentences = {train = 11259, valid = 1122, test = 1111},
  unigram_test_ppl = 79.229762,
  bigram_test_ppl = 19.991369,
  trigram_test_ppl = 18.662296,
  seed = 20240611,
}

-- nd.text's tokenizers (spec/text_spec.lua has the rest of their errors)
return function(nd)
  local T = nd.text
  local FIX = "spec/fixtures/text/"
  local WP = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "hello"}
  local wp = T.WordPiece.new(WP)
  local bpe = T.ByteBPE.from_files(FIX .. "gpt2_vocab.json", FIX .. "gpt2_merges.txt")
  local NEW = "cls_token, lowercase, mask_token, max_input_chars_per_word, model_max_length, pad_token, " ..
              "sep_token, strip_accents, tokenize_chinese_chars, unk_token"
  local ENCODE = "add_special_tokens, max_length, padding, return_offsets_mapping, truncation"
  return {rest = {
    {"text.WordPiece.new", NEW, function(o) return T.WordPiece.new(WP, o) end},
    {"text.WordPiece.from_file", NEW, function(o) return T.WordPiece.from_file(FIX .. "bert_vocab.txt", o) end},
    {"text.WordPiece.encode", ENCODE, function(o) return wp:encode("hello", o) end},
    {"text.WordPiece.encode_batch", "add_special_tokens, device, max_length, padding, return_offsets_mapping, " ..
     "return_overflowing_tokens, return_tensors, stride, truncation",
     function(o) return wp:encode_batch({"hello"}, o) end},
    {"text.WordPiece.decode", "clean_up_tokenization_spaces, skip_special_tokens",
     function(o) return wp:decode({5}, o) end},
    {"text.answer_spans", "align_to_words, handle_impossible_answer, max_answer_len, top_k", function(o)
      local e = wp:encode("hello", {return_offsets_mapping = true})
      return T.answer_spans({0, 1, 0}, {0, 1, 0}, e, "hello", o)
    end},
    {"text.ByteBPE.new", "special_tokens", function(o)
      local v = {}
      for b = 0, 255 do v[#v + 1] = T.ByteBPE.bytes_to_unicode[b] end
      return T.ByteBPE.new(v, {}, o)
    end},
    {"text.ByteBPE.from_files", "special_tokens",
     function(o) return T.ByteBPE.from_files(FIX .. "gpt2_vocab.json", FIX .. "gpt2_merges.txt", o) end},
    {"text.ByteBPE.encode", "allowed_special, return_offsets_mapping", function(o) return bpe:encode("hi", o) end},
    {"text.ByteBPE.tokenize", "allowed_special, return_offsets_mapping", function(o) return bpe:tokenize("hi", o) end},
    {"text.ByteBPE.decode", "skip_special_tokens", function(o) return bpe:decode({1}, o) end},
  }}
end
